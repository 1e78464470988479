"""``attnlab convert`` both ways, and exporting attnlab-native models to transformers."""

from __future__ import annotations

import json

import pytest
import torch
import transformers  # test extra, pinned in pyproject
from tokenizers import Tokenizer, models, pre_tokenizers

import attnlab
from attnlab.cli import main
from attnlab.commands.interop import parse_size
from attnlab.config import ModelConfig
from attnlab.interop import from_hf, load_hf_lm, to_hf
from attnlab.models.lm import DecoderLM
from attnlab.runs import save_model
from test_interop_hf import V, build_hf, randomise


def word_tokenizer():
    """A tiny word-level ``tokenizers`` tokenizer with V tokens w0 … w96."""
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def test_convert_from_hf_and_back(tmp_path, capsys):
    hf = build_hf("llama", num_hidden_layers=1, tie_word_embeddings=False, eos_token_id=5)
    hf.save_pretrained(tmp_path / "hf")
    word_tokenizer().save(str(tmp_path / "hf" / "tokenizer.json"))

    run = tmp_path / "runs" / "llama"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(run)]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    model, tok = attnlab.load(run)
    assert tok.encode("w3 w7 w11") == [3, 7, 11]
    ids = torch.tensor([tok.encode("w3 w7 w11 w20")])
    with torch.no_grad():
        assert (model(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-4
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["kind"] == "decoder_lm" and cfg["source"]["eos_token_id"] == 5

    # an existing run is not overwritten silently
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(run)]) == 2
    assert "--overwrite" in capsys.readouterr().err

    out = tmp_path / "exported"
    assert main(["convert", "--to-hf", str(run), "--out", str(out)]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert back.config.eos_token_id == 5
    assert (out / "tokenizer.json").read_text() == (tmp_path / "hf" / "tokenizer.json").read_text()


def test_convert_failure_writes_nothing(tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(
        json.dumps({"architectures": ["MambaForCausalLM"]})
    )
    rc = main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")])
    assert rc == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("attnlab: error:")
        and "MambaForCausalLM" in err
        and "LlamaForCausalLM" in err
    )
    assert not (tmp_path / "run").exists()
    (tmp_path / "file").write_text("x")
    for argv in (
        ["--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "file")],
        ["--to-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "x")],
    ):
        assert main(["convert", *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "exists and is not a directory" in err[0] and "not an attnlab config" in err[1]


def test_load_hf_lm_for_generation(tmp_path):
    """What ``attnlab generate --from-hf`` uses: model + tokenizer, the model's eos id."""
    hf = build_hf("gpt2", n_layer=1)
    hf.save_pretrained(tmp_path / "hf")
    with pytest.raises(attnlab.errors.UserError, match="no tokenizer.json"):
        load_hf_lm(tmp_path / "hf")
    word_tokenizer().save(str(tmp_path / "hf" / "tokenizer.json"))
    model, tok = load_hf_lm(tmp_path / "hf")
    ids = torch.tensor([tok.encode("w1 w2 w3")])
    out = attnlab.generate(model, ids, 5, temperature=0.0)
    ref = hf.generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out, ref)
    assert model.hf_config["eos_token_id"] == 0
    # transformers' generate reads generation_config.json first: so does from_hf
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 7]}))
    model, _ = load_hf_lm(tmp_path / "hf")
    assert model.hf_config["eos_token_id"] == [0, 7]


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("gpt2-tiny", {}),
        ("gpt2-tiny", {"bias": False, "tie_embeddings": False, "activation": "relu"}),
        ("llama-tiny", {}),
        ("llama-tiny", {"n_kv_heads": 1, "tie_embeddings": True, "bias": True}),
        ("mixtral-tiny", {}),
    ],
)
def test_native_presets_export_to_transformers(tmp_path, preset, overrides):
    """A model attnlab built itself (derived widths, its own defaults) is the same function in
    transformers after export, and the CLI exports its run directory. A bias-free GPT-2-style model
    exports zero biases (the same function)."""
    cfg = ModelConfig.preset(preset, vocab_size=V, max_seq_len=32, **overrides)
    model = randomise(DecoderLM(cfg)).eval()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"kind": model.kind, "model": model.config.to_dict()})
    )
    save_model(model, run / "model.safetensors")
    assert main(["convert", "--to-hf", str(run), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "hf", attn_implementation="eager", dtype=torch.float32
    ).eval()
    ids = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        assert (model(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-4
    again = from_hf(tmp_path / "hf")
    assert (again.config.n_kv_heads, again.config.tie_embeddings) == (
        cfg.n_kv_heads,
        cfg.tie_embeddings,
    )
    if cfg.bias or preset != "gpt2-tiny":
        for k, v in model.state_dict().items():
            assert torch.equal(again.state_dict()[k], v), k
    to_hf(again, tmp_path / "hf2")  # and once more, from the loaded copy
    assert json.loads((tmp_path / "hf2" / "config.json").read_text()) == json.loads(
        (tmp_path / "hf" / "config.json").read_text()
    )


def test_parse_shard_size():
    assert parse_size("2GB") == 2 * 10**9 and parse_size("500MiB") == 500 * 2**20
    assert parse_size("4096") == 4096
    with pytest.raises(attnlab.errors.UserError, match="--max-shard-size"):
        parse_size("lots")


def test_converted_run_without_tokenizer_loads_with_tokenizer_none(tmp_path, capsys):
    hf = build_hf("gpt2", n_layer=1)
    hf.save_pretrained(tmp_path / "hf")  # no tokenizer.json beside the weights
    run = tmp_path / "run"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(run)]) == 0
    model, tok = attnlab.load(run)
    assert tok is None
    ids = torch.randint(0, V, (1, 6))
    with torch.no_grad():
        assert (model(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-4
    # generating text needs a tokenizer: one clear message, exit 2
    assert main(["generate", str(run), "--prompt", "hi", "-n", "2"]) == 2
    assert "tokenizer" in capsys.readouterr().err


def test_generate_on_a_converted_run_stops_at_the_checkpoints_end_of_text(tmp_path, capsys):
    hf = build_hf("llama", num_hidden_layers=1)
    hf.save_pretrained(tmp_path / "hf")
    word_tokenizer().save(str(tmp_path / "hf" / "tokenizer.json"))
    run = tmp_path / "run"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(run)]) == 0
    model, tok = attnlab.load(run)
    prompt = "w3 w7 w11"
    greedy = attnlab.generate(model, torch.tensor([tok.encode(prompt)]), 6, temperature=0.0)
    first = int(greedy[0, 3])
    argv = ["generate", str(run), "--prompt", prompt, "-n", "6", "--temperature", "0"]
    capsys.readouterr()
    assert main(argv) == 0
    words = [f"w{int(t)}" for t in greedy[0]]
    assert capsys.readouterr().out.replace(" ", "").strip() == "".join(words)

    cfg = json.loads((run / "config.json").read_text())
    cfg["source"]["eos_token_id"] = first  # the first greedy token is now end-of-text
    (run / "config.json").write_text(json.dumps(cfg))
    assert main(argv) == 0
    # stopped at once: nothing after the prompt (the stop token itself is not printed)
    assert capsys.readouterr().out.replace(" ", "").strip() == "".join(words[:3])
