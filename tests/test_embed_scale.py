"""The LM's embedding scale: sinusoidal positions are only learnable with √d_model-scaled token
embeddings (the Transformer paper §3.4).

- the default: √d_model for sinusoidal positions, 1.0 otherwise; recorded in config.json; a model
  section of the first release (no ``embed_scale``) reads as 1.0, the behaviour it was trained
  with; the embedding is ``scale · E[idx] + P[pos]``;
- HF export refuses a scale the GPT-2/Llama configs cannot express;
- seeded training (slow, ~15 s): a tiny sinusoidal LM with the default scale ends clearly below
  the corpus's unigram entropy, the same run at scale 1.0 near it. Measured (d_model 32, 300
  steps, lr 1e-2, windows of 16 characters of pydoc, 50,000 characters; shared busy machine):
  unigram 3.206, scaled 2.771, unscaled 3.139 nats/char.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.errors import UserError
from attnlab.experiments.extrapolation import loss_by_position
from attnlab.experiments.lm_runs import lm_model, lm_task, train_run
from attnlab.interop.hf.lm import lm_config_to_hf
from attnlab.models.lm import DecoderLM
from attnlab.train import TrainConfig

FIXTURES = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"


def test_default_scale_is_sqrt_d_for_sinusoidal_and_1_otherwise():
    cfg = ModelConfig.preset("tiny", position="sinusoidal")
    assert cfg.embed_scale == math.sqrt(cfg.d_model) == 8.0
    for position in ("learned", "rope", "alibi", "t5", "none"):
        assert ModelConfig.preset("tiny", position=position).embed_scale == 1.0
    assert ModelConfig.preset("tiny", position="sinusoidal", embed_scale=1.0).embed_scale == 1.0
    assert cfg.to_dict()["embed_scale"] == 8.0  # recorded resolved
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="embed_scale must be positive"):
        ModelConfig.preset("tiny", embed_scale=0.0)


def test_first_release_sections_read_as_scale_1():
    for name in ("lm_gpt2", "lm_llama", "lm_moe_alibi"):
        model = json.loads((FIXTURES / name / "config.json").read_text())["model"]
        assert "embed_scale" not in model
        assert ModelConfig.from_dict(model).embed_scale == 1.0
        # even switched to sinusoidal: such a section was trained (or copied) without a scale
        assert ModelConfig.from_dict({**model, "position": "sinusoidal"}).embed_scale == 1.0
    # a preset plus a few settings is not a recorded section: it gets today's default
    assert ModelConfig.from_dict({"position": "sinusoidal", "d_model": 16}).embed_scale == 4.0


def test_embedding_is_scaled_tokens_plus_positions():
    cfg = ModelConfig.preset("tiny", position="sinusoidal", d_model=16, vocab_size=11)
    torch.manual_seed(0)
    model = DecoderLM(cfg).eval()
    idx = torch.randint(0, 11, (2, 5))
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    model(idx)
    pos = model.pos_emb.embed(torch.zeros(1, 5, 16), torch.arange(5))  # (1, 5, 16): P alone
    want = 4.0 * model.tok_emb.weight[idx] + pos
    torch.testing.assert_close(seen["x"], want)


def test_hf_export_refuses_a_scale_it_cannot_express():
    cfg = ModelConfig.preset("tiny", embed_scale=2.0)  # learned positions: GPT-2 otherwise
    with pytest.raises(UserError, match="embed_scale=1.0, not embed_scale=2.0"):
        lm_config_to_hf(cfg, "gpt2")
    assert lm_config_to_hf(ModelConfig.preset("tiny"), "gpt2")["model_type"] == "gpt2"


@pytest.mark.slow
def test_sinusoidal_lm_learns_with_the_scale_and_not_without(tmp_path):
    torch.set_num_threads(1)
    task = lm_task("pydoc", 16, max_chars=50_000)
    counts = Counter(task.ids.tolist())
    n = sum(counts.values())
    unigram = -sum(c / n * math.log(c / n) for c in counts.values())
    xs, ys = zip(*task.eval_batches(8, 16))
    idx, tgt = torch.cat(xs), torch.cat(ys)
    val = {}
    for scale in (None, 1.0):
        model = lm_model(
            "tiny", task.vocab_size, seed=0, max_seq_len=16, position="sinusoidal", d_model=32,
            embed_scale=scale,
        )  # fmt: skip
        cfg = TrainConfig(
            steps=300, batch_size=16, lr=1e-2, warmup_steps=10, eval_batches=0, log_every=1,
            seed=0, progress=False,
        )  # fmt: skip
        res = train_run(model, task, cfg, tmp_path / str(scale))
        assert not res["diverged"], res["how"]
        val[scale] = loss_by_position(model, idx, tgt, 16).mean().item()
    # measured: unigram 3.206, scaled 2.771 (0.44 below), unscaled 3.139 (0.07 below)
    assert val[None] < unigram - 0.25, (val, unigram)
    assert val[1.0] > unigram - 0.2, (val, unigram)
    assert val[None] < val[1.0] - 0.2, val
