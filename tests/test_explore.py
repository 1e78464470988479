"""The explorer's numbers: the payload holds exactly the model's attention weights and raw scores,
its entropy and rollout follow their formulas, and bad input gets one clear message."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import re
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.attention import capture_attention
from attnlab.explore import ExploreInput, Explorer, render_page
from attnlab.explore.payload import entropy_bits, rollout_matrix
from attnlab.runs import load
from explore_runs import LM_TEXT, image_file, image_run, lm_run


def decode(arr: dict) -> torch.Tensor:
    """A payload array back to a tensor."""
    data = np.frombuffer(base64.b64decode(arr["data"]), dtype="<f4")
    return torch.from_numpy(data.copy()).view(arr["shape"])


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return lm_run(tmp_path_factory.mktemp("explore") / "lm")


def cli(*args: str) -> subprocess.CompletedProcess:
    """``attnlab ARGS`` in this process (a subprocess would import torch again for each)."""
    from attnlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def test_raw_scores_are_qk_over_sqrt_d_and_their_softmax_is_the_weights(lm):
    """capture_attention(scores=True): the reported scores are Q Kᵀ/√d recomputed from the layer's
    own Q/K projection of its input (causal entries −∞), and softmax(scores) is the weights."""
    model = load(lm).model
    idx = torch.tensor([[1, 5, 3, 7, 2, 9]])
    inputs = {}
    attn = model.blocks[1].attn
    hook = attn.register_forward_pre_hook(lambda m, args: inputs.setdefault("x", args[0]))
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(idx)
    hook.remove()
    scores, weights = maps.scores("blocks.1.attn"), maps["blocks.1.attn"]
    B, T, C = inputs["x"].shape
    H, D = attn.n_heads, attn.head_dim
    q, k, _ = attn.qkv(inputs["x"]).split(C, dim=-1)
    q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = k.view(B, T, H, D).transpose(1, 2)
    expected = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(scores[..., causal], expected[..., causal])
    assert torch.isinf(scores[..., ~causal]).all() and (scores[..., ~causal] < 0).all()
    torch.testing.assert_close(scores.softmax(-1), weights)
    with torch.no_grad(), capture_attention(model) as plain:  # scores only when asked
        model(idx)
    assert plain.scores("blocks.1.attn") is None


def test_lm_payload_holds_the_models_weights_and_scores(lm):
    payload = Explorer(lm).explain(ExploreInput(text="the cat sat"))
    (view,) = payload["views"]
    model = load(lm).model
    ids = load(lm).tokenizer.encode("the cat sat")
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(torch.tensor([ids]))
    assert view["queries"] == list("the cat sat") and view["keys"] == view["queries"]
    assert view["layers"] == ["blocks.0.attn", "blocks.1.attn"]
    w, s = decode(view["weights"]), decode(view["scores"])
    assert w.shape == (2, 4, 11, 11)
    for layer, name in enumerate(view["layers"]):
        assert torch.equal(w[layer], maps[name][0])  # the same float32 numbers
        assert torch.equal(s[layer], maps.scores(name)[0])
    assert view["head_dim"] == 16 and view["query"] == len(ids) - 1
    assert payload["summary"][1].startswith("next token:")
    json.dumps(payload, allow_nan=False)  # plain JSON: −∞ only inside the float32 data


def test_entropy_is_mean_row_entropy_in_bits():
    w = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 0.0]]]])
    # rows: one key (0 bits), four keys evenly (2 bits), a fully masked row (left out)
    assert entropy_bits(w).item() == pytest.approx(1.0)


def test_rollout_matches_the_vision_rollout_and_is_row_stochastic():
    """Row 0 of the rollout matrix is the class token's rollout of attnlab.viz.vision (a live
    reference), and every row of it is a distribution."""
    from attnlab.viz.vision import attention_rollout

    torch.manual_seed(0)
    w = torch.rand(3, 2, 5, 5).softmax(-1)  # (L, H, T, T)
    r = rollout_matrix(w)
    reference = attention_rollout([layer[None] for layer in w], n_prefix=1)[0]  # (T - 1,)
    torch.testing.assert_close(r[0, 1:], reference)
    torch.testing.assert_close(r.sum(-1), torch.ones(5))


def test_page_is_self_contained(lm, tmp_path):
    """One file: inline script and style, the data embedded, a policy that forbids requests, no
    URL of anywhere else, and no way for the data to close its script element."""
    payload = Explorer(lm).explain(ExploreInput(text="the cat sat"))
    payload["input"] = "</script><script>alert(1)</script>"
    page = render_page(payload)
    assert "connect-src 'none'" in page and "default-src 'none'" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert page.count("</script>") == 3  # config, data, the explorer
    data = page.split('<script id="attn-data" type="application/json">')[1].split("</script>")[0]
    assert json.loads(data)["input"] == payload["input"]


def test_cli_writes_the_page(lm, tmp_path):
    out = tmp_path / "page.html"
    r = cli("explore", str(lm), "--input", "a dog ran", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 10_000 and "wrote" in r.stdout


@pytest.fixture(scope="module")
def lstm(tmp_path_factory):
    from explore_runs import _save

    run = tmp_path_factory.mktemp("explore") / "lstm"
    _save(run, "lstm_lm", load_config("lstm_lm"))
    return run


def load_config(kind):
    from explore_runs import _config

    return _config(kind)


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error:"), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_input_is_one_clear_message(lm, lstm, tmp_path):
    png = image_file(tmp_path / "digit.png")
    out = str(tmp_path / "p.html")
    _one_line_error(
        cli("explore", str(lstm), "--input", "x", "--out", out), "lstm_lm", "no attention"
    )
    _one_line_error(
        cli("explore", str(lm), "--input", str(png), "--out", out), "reads text", "image"
    )
    _one_line_error(
        cli("explore", str(lm), "--input", LM_TEXT * 2, "--out", out), "tokens", "context is 32"
    )
    _one_line_error(cli("explore", str(lm), "--out", out), "--input")
    _one_line_error(
        cli("explore", str(lm), "--input", "a", "--question", "why?", "--out", out), "question"
    )
    _one_line_error(cli("explore", str(lm), "--input", "a €", "--out", out), "€")
    assert not Path(out).exists()


def test_text_for_an_image_model_is_refused(tmp_path):
    run = image_run(tmp_path / "vit")
    r = cli("explore", str(run), "--input", "not an image", "--out", str(tmp_path / "p.html"))
    _one_line_error(r, "reads an image file")


def test_port_in_use_is_one_clear_message(lm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("explore", str(lm), "--serve", "--port", str(port))
    _one_line_error(r, f"port {port}", "in use")
