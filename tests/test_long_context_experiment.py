"""The long-context experiment at a seeded small size: the claims that hold even for a briefly
trained model (memory and overlapping windows beat disjoint chunks; memory reads as fast as
disjoint chunks and far faster than recomputing a window per token; the counted costs), and the
readings' bookkeeping (every reading scores every token once; disjoint = sliding with stride L)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from attnlab.config.variants import TransformerXLConfig
from attnlab.errors import UserError
from attnlab.experiments.long_context import (
    LongContextConfig,
    read_memory,
    read_sliding,
    run_long_context,
)
from attnlab.models.transformer_xl import TransformerXL
from attnlab.runs import load


def test_readings_score_every_token_once_and_count_their_cost():
    torch.manual_seed(0)
    model = TransformerXL(
        TransformerXLConfig.preset("tiny", vocab_size=7, d_model=16, mem_len=8)
    ).eval()
    docs = torch.randint(0, 7, (2, 41))  # N = 40
    disjoint = read_sliding(model, docs, 8, 8)
    assert disjoint.rows == 2 * 40 and disjoint.pairs == 2 * 5 * (8 * 9 // 2)
    by_hand = torch.cat(
        [
            torch.nn.functional.cross_entropy(
                model(docs[:, b : b + 8]).out.transpose(1, 2),
                docs[:, b + 1 : b + 9],
                reduction="none",
            )
            for b in range(0, 40, 8)
        ],
        dim=1,
    )
    torch.testing.assert_close(disjoint.nll, by_hand)
    sliding = read_sliding(model, docs, 8, 2)
    assert sliding.rows == 2 * (8 + 16 * 8)  # the first window, then 16 windows for 2 each
    memory = read_memory(model, docs, 8)
    assert memory.rows == 2 * 40 and memory.pairs == 2 * (36 + 4 * (8 * 8 + 36))
    assert torch.isfinite(sliding.nll).all() and torch.isfinite(memory.nll).all()


def _topic_text(path, n: int = 60_000) -> str:
    """Passages of 200 letters, each drawn from its own 3 of 16 letters: ln 3 nats per letter
    once the passage's letters are known, ln 16 before; a chunk read alone starts not knowing."""
    rng = random.Random(0)
    letters = "abcdefghijklmnop"
    out = []
    while len(out) < n:
        chosen = rng.sample(letters, 3)
        out += [rng.choice(chosen) for _ in range(200)]
    path.write_text("".join(out), encoding="utf-8")
    return str(path)


def test_long_context_claims_at_small_size(tmp_path):
    cfg = LongContextConfig(
        data=_topic_text(tmp_path / "topics.txt"),
        steps=60,
        segment=16,
        doc_len=96,
        n_docs=8,
        d_model=32,
        max_chars=200_000,
        progress=False,
        seed=0,
    )
    res = run_long_context(cfg, tmp_path / "lc")
    r = res["readings"]
    assert r["memory"]["loss"] < r["disjoint"]["loss"]
    assert r["sliding"]["loss"] < r["disjoint"]["loss"]
    assert r["memory"]["rows_per_token"] == r["disjoint"]["rows_per_token"] == 1.0
    assert r["sliding"]["rows_per_token"] > 3  # stride L/4: about four times the rows
    assert r["memory"]["keys_per_token"] > r["disjoint"]["keys_per_token"]
    assert res["speedup"] > 3  # 16x fewer rows; a margin for a loaded machine
    table = (tmp_path / "lc" / "table.md").read_text()
    assert "memory" in table and "full" in table
    assert json.loads((tmp_path / "lc" / "results.json").read_text())["train"]["steps"] == 60
    assert (tmp_path / "lc" / "loss_by_position.png").stat().st_size > 0
    run = load(tmp_path / "lc" / "runs" / "xl")  # the trained model, its tokenizer
    assert run.kind == "transformer_xl" and run.model.config.mem_len == 16
    assert run.tokenizer.vocab_size == run.model.config.vocab_size


def test_bad_settings_are_named():
    with pytest.raises(UserError, match="doc_len=16 must be longer than the segment 16"):
        LongContextConfig(segment=16, doc_len=16)
    with pytest.raises(UserError, match="stride=20 must not exceed the segment 16"):
        LongContextConfig(segment=16, stride=20)
