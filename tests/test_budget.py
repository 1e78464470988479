"""The budget rule (attnlab.runspec.budget): a pure, monotone, deterministic choice of model size,
batch, window, learning rate, warm-up and dropout; and ``attnlab train lm`` using it when no model
is named."""

import dataclasses
import itertools
import json

import pytest
import torch

from attnlab.cli import main
from attnlab.runspec import budget, build_run, resolve
from attnlab.runspec.budget import (
    MAX_PARAMS_PER_TOKEN,
    REFERENCE,
    REFERENCE_STEPS_PER_S,
    ROWS,
    choose_lm_settings,
    row_cost,
    row_params,
)

PYDOC = 418_544  # training characters of the pydoc corpus
BUDGETS = [1, 5, 20, 45, 60, 75, 90, 120, 300, 600, 1800, 3600, 4 * 3600, 48 * 3600]
STEPS = [1, 10, 100, 500, 1000, 1200, 2000, 3000, 5000, 10_000, 100_000]


def _params(choice, vocab=128):
    return row_params(choice.row, vocab)


def test_a_bigger_time_budget_never_gives_a_smaller_model():
    for corpus, speed in itertools.product([5_000, PYDOC, 10**8], [0.5, 22.5, 400.0]):
        sizes = [
            _params(choose_lm_settings(budget_s=b, corpus_tokens=corpus, ref_steps_per_s=speed))
            for b in BUDGETS
        ]
        assert sizes == sorted(sizes), (corpus, speed, sizes)


def test_a_bigger_step_budget_or_a_faster_machine_never_gives_a_smaller_model():
    for corpus in (5_000, PYDOC, 10**8):
        sizes = [_params(choose_lm_settings(steps=s, corpus_tokens=corpus)) for s in STEPS]
        assert sizes == sorted(sizes)
        by_speed = [
            _params(choose_lm_settings(budget_s=60, corpus_tokens=corpus, ref_steps_per_s=v))
            for v in (0.1, 1, 10, 22.5, 100, 1000, 10_000)
        ]
        assert by_speed == sorted(by_speed)


def test_the_rows_grow_and_the_rule_reaches_the_largest_with_enough_budget_and_data():
    sizes = [row_params(r) for r in ROWS]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    costs = [row_cost(r) for r in ROWS]
    assert costs == sorted(costs) and row_cost(REFERENCE) == pytest.approx(1.0)
    big = choose_lm_settings(budget_s=10**7, corpus_tokens=10**9)
    assert big.row == ROWS[-1]


def test_the_rule_is_deterministic_and_pure():
    kw = dict(budget_s=75, corpus_tokens=PYDOC, ref_steps_per_s=30.0, vocab_size=103)
    assert choose_lm_settings(**kw) == choose_lm_settings(**kw)


def test_the_sweeps_points_give_the_measured_recipes():
    """The sweep's machine (15.5 reference steps/s): xs won at 30-150 s, s at 300 s."""
    c = choose_lm_settings(budget_s=150, corpus_tokens=PYDOC, vocab_size=103, ref_steps_per_s=15.5)
    assert c.row.name == "xs" and c.model["n_layers"] == 2 and c.model["d_model"] == 64
    assert (c.seq_len, c.batch_size, c.lr, c.warmup_steps, c.dropout) == (64, 12, 4e-3, 50, 0.0)
    assert c.model["position"] == "rope" and c.model["max_seq_len"] == 64
    c = choose_lm_settings(budget_s=300, corpus_tokens=PYDOC, vocab_size=103, ref_steps_per_s=15.5)
    assert c.row.name == "s" and c.model["n_layers"] == 4 and c.model["d_model"] == 128
    assert c.steps == pytest.approx(300 * 15.5, abs=5) and (c.lr, c.dropout) == (4e-3, 0.0)
    # issue 12's point (89 s on its machine, 2000 reference steps) is below s's crossing
    assert choose_lm_settings(budget_s=89, corpus_tokens=PYDOC, vocab_size=103).row.name == "xs"


def test_with_muon_the_rows_measured_adamw_rate_is_chosen():
    """benchmarks/demo_recipes.py at the demo's settings (880 steps): with the matrices on Muon,
    rows xs and s are best with the AdamW part at lr 0.02 (xs: 1.316 nats/char against 1.380 at
    the row's 4e-3; s: 1.245 against 1.263); a row without a measured rate keeps its own;
    AdamW runs are unchanged."""
    kw = dict(budget_s=45, corpus_tokens=PYDOC, vocab_size=103, ref_steps_per_s=15.5)
    muon = choose_lm_settings(**kw, optimizer="muon")
    assert muon.row.name == "xs" and muon.lr == 0.02
    at_300 = choose_lm_settings(**{**kw, "budget_s": 300}, optimizer="muon")
    assert at_300.row.name == "s" and at_300.lr == 0.02
    assert choose_lm_settings(**kw).lr == choose_lm_settings(**kw, optimizer="adamw").lr == 4e-3
    # everything but the rate is the AdamW choice where the rows' crossings agree
    assert muon == dataclasses.replace(choose_lm_settings(**kw), lr=0.02, optimizer="muon")
    unmeasured = [r for r in ROWS if r.lr_with_muon is None]
    for row in unmeasured:
        c = choose_lm_settings(steps=10**4, corpus_tokens=10**9, rows=(row,), optimizer="muon")
        assert c.lr == row.lr


def test_with_muon_row_s_passes_xs_from_fewer_steps():
    """The speedrun's trials on one thread (13.8 reference steps/s; benchmarks/speedrun.py's
    split and score, Muon for both rows): row xs ahead at 45 s (621 reference steps), row s
    ahead at 100 s (1,380) and 161 s (2,222), where AdamW's crossing (3,000) still gives xs."""
    kw = dict(corpus_tokens=PYDOC, vocab_size=103, ref_steps_per_s=13.8)
    assert choose_lm_settings(budget_s=45, **kw, optimizer="muon").row.name == "xs"
    for budget_s in (100, 161):
        muon = choose_lm_settings(budget_s=budget_s, **kw, optimizer="muon")
        assert muon.row.name == "s" and muon.lr == ROWS[1].lr_with_muon
        assert choose_lm_settings(budget_s=budget_s, **kw).row.name == "xs"
    # the crossing itself: at R = 1300 reference steps row s is chosen, one step short it is not
    s_at = dict(corpus_tokens=PYDOC, vocab_size=103, optimizer="muon")
    assert choose_lm_settings(steps=1300, **s_at).row.name == "s"
    assert choose_lm_settings(steps=1299, **s_at).row.name == "xs"
    # still monotone: more budget never gives a smaller model
    sizes = [_params(choose_lm_settings(budget_s=b, **kw, optimizer="muon")) for b in BUDGETS]
    assert sizes == sorted(sizes)


def test_the_rule_takes_muon_where_its_rows_were_measured_with_it():
    """``optimizer="auto"`` (``attnlab train lm`` without ``--set train.optimizer``): the speedrun
    table (benchmarks/speedrun.py, docs/performance.md §5) measured the rule with Muon ahead of
    the rule with AdamW at 75 and 150 s and level at 300 s, so rows xs and s take Muon and its
    settings (row s from 1,300 reference steps, the AdamW part at 0.02); a row never measured
    with Muon (m and up) is AdamW's choice, unchanged; still monotone."""
    kw = dict(corpus_tokens=PYDOC, vocab_size=103, ref_steps_per_s=13.8)
    for budget_s, row in ((45, "xs"), (75, "xs"), (161, "s"), (300, "s")):
        auto = choose_lm_settings(budget_s=budget_s, **kw, optimizer="auto")
        assert auto == choose_lm_settings(budget_s=budget_s, **kw, optimizer="muon")
        assert (auto.row.name, auto.optimizer, auto.lr) == (row, "muon", 0.02)
    big = dict(steps=10**5, corpus_tokens=10**9, vocab_size=103)
    auto = choose_lm_settings(**big, optimizer="auto")
    assert auto.row.lr_with_muon is None and auto.optimizer == "adamw"
    assert auto == choose_lm_settings(**big)  # exactly AdamW's choice
    sizes = [_params(choose_lm_settings(budget_s=b, **kw, optimizer="auto")) for b in BUDGETS]
    assert sizes == sorted(sizes)


def test_train_lm_keeps_a_typed_optimizer_and_fsdp_keeps_adamw(_cache):
    """A typed optimizer is the user's: ``--set train.optimizer=adamw`` keeps AdamW and the row's
    AdamW rate; under FSDP (Muon needs whole matrices) the rule does not pick Muon."""
    flags = {"train.steps": 2, "task.max_chars": 20000}
    typed = resolve(None, flags, ["train.optimizer=adamw"])
    build_run(typed)
    assert (typed.train.optimizer, typed.train.lr) == ("adamw", ROWS[0].lr)
    sharded = resolve(None, {**flags, "train.strategy": "fsdp"}, [])
    build_run(sharded)
    assert (sharded.train.optimizer, sharded.train.lr) == ("adamw", ROWS[0].lr)
    ruled = resolve(None, flags, [])
    build_run(ruled)
    assert (ruled.train.optimizer, ruled.train.lr) == ("muon", ROWS[0].lr_with_muon)
    assert "Muon for the matrices, AdamW lr 0.02" in ruled.describe_choice()


def test_the_rows_measured_with_the_token_shift_take_it_and_a_set_turns_it_off(_cache):
    """The speedrun table measured RWKV's token shift ahead on row xs (with Muon and with AdamW)
    and not on row s at every budget: row xs's model carries it, the others do not; ``--set
    model.token_shift=false`` keeps the rule's choice of size and recipe without it."""
    assert [r.name for r in ROWS if r.token_shift] == ["xs"]
    for row in ROWS:
        assert row.model_fields()["token_shift"] is row.token_shift
    kw = dict(corpus_tokens=PYDOC, vocab_size=103, ref_steps_per_s=13.8, optimizer="auto")
    for budget_s, row, shift in ((45, "xs", True), (75, "xs", True), (300, "s", False)):
        choice = choose_lm_settings(budget_s=budget_s, **kw)
        assert (choice.row.name, choice.model["token_shift"]) == (row, shift)
    assert choose_lm_settings(steps=10**5, corpus_tokens=10**9).model["token_shift"] is False
    flags = {"train.steps": 2, "task.max_chars": 20000}
    ruled = resolve(None, flags, [])
    model, _ = build_run(ruled)
    assert model.config.token_shift and model.shift_mix is not None
    assert "(RoPE, token shift, dropout" in ruled.describe_choice()
    plain = resolve(None, flags, ["model.token_shift=false"])
    model, _ = build_run(plain)
    assert not model.config.token_shift and plain.choice.row == ruled.choice.row
    assert plain.train.lr == ruled.train.lr and plain.train.optimizer == "muon"


def test_train_lm_with_muon_takes_the_rows_muon_rate(tmp_path, capsys):
    """No model named, ``--set train.optimizer=muon``: the run's config.json holds the row's Muon rate."""
    argv = ["train", "lm", "--data", "pydoc", "--max-chars", "20000", "--steps", "2",
            "--no-progress", "--set", "train.optimizer=muon", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["train"]["lr"] == ROWS[0].lr_with_muon and cfg["train"]["optimizer"] == "muon"
    assert "lr 0.02" in capsys.readouterr().err


def test_a_model_far_smaller_than_its_corpus_gets_no_dropout_at_ten_passes():
    """Dropout counts passes times min(1, parameters / corpus tokens)."""
    xs, s = ROWS[0], ROWS[1]
    corpus = 10 * row_params(xs)  # xs is a tenth of the corpus, s larger than it
    # 20 passes for either: xs counts 2 weighted passes, s all 20
    steps_xs = 20 * corpus // (xs.batch_size * xs.seq_len)
    c = choose_lm_settings(steps=steps_xs, corpus_tokens=corpus, rows=(xs,))
    assert c.epochs == pytest.approx(20, rel=0.01) and c.dropout == 0.0
    c = choose_lm_settings(steps=steps_xs, corpus_tokens=corpus, rows=(s,))
    assert c.epochs == pytest.approx(20, rel=0.01) and c.dropout == 0.1


def test_edge_cases_tiny_budget_tiny_corpus_and_bad_inputs():
    tiny = choose_lm_settings(budget_s=0.01, corpus_tokens=PYDOC)
    assert tiny.row == ROWS[0] and tiny.steps >= 1 and tiny.warmup_steps >= 1
    one = choose_lm_settings(steps=1, corpus_tokens=PYDOC)
    assert one.row == ROWS[0] and one.warmup_steps == 1
    # a corpus of a few thousand tokens never gets a model of many more parameters
    small = choose_lm_settings(budget_s=10**6, corpus_tokens=5_000)
    assert row_params(small.row) <= max(MAX_PARAMS_PER_TOKEN * 5_000, row_params(ROWS[0]))
    assert small.dropout == 0.2  # thousands of passes over it
    for kw in (
        dict(corpus_tokens=PYDOC),
        dict(budget_s=0, corpus_tokens=PYDOC),
        dict(steps=0, corpus_tokens=PYDOC),
        dict(budget_s=10, corpus_tokens=0),
        dict(budget_s=10, corpus_tokens=PYDOC, ref_steps_per_s=0),
    ):
        with pytest.raises(ValueError):
            choose_lm_settings(**kw)


def test_time_wins_over_steps_and_warm_up_is_at_most_a_tenth_of_the_run():
    c = choose_lm_settings(budget_s=30, steps=10**6, corpus_tokens=PYDOC)
    assert c.steps == int(30 * REFERENCE_STEPS_PER_S / row_cost(c.row))
    for b in BUDGETS:
        c = choose_lm_settings(budget_s=b, corpus_tokens=PYDOC)
        assert 1 <= c.warmup_steps <= max(1, c.steps // 10)
        assert c.tokens == c.steps * c.batch_size * c.seq_len
        assert c.epochs == pytest.approx(c.tokens / PYDOC)


def test_dropout_rises_with_the_passes_over_the_corpus():
    drops = [choose_lm_settings(steps=s, corpus_tokens=PYDOC).dropout for s in STEPS]
    low = [choose_lm_settings(steps=s, corpus_tokens=PYDOC).epochs <= 10 for s in STEPS]
    assert all(d == 0.0 for d, lo in zip(drops, low) if lo)
    assert max(drops) == 0.2


# -- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize("one_thread_faster", [True, False])
def test_the_speed_measurement_leaves_torch_on_the_faster_thread_count(
    monkeypatch, one_thread_faster
):
    before = torch.get_num_threads()
    speeds = {1: 30.0 if one_thread_faster else 10.0, 2: 20.0}
    monkeypatch.setattr(  # the measurement itself stands in: a speed per thread count
        budget, "measure_ref_steps_per_s", lambda **kw: speeds[min(torch.get_num_threads(), 2)]
    )
    try:
        torch.set_num_threads(2)
        got = budget.fastest_ref_steps_per_s(vocab_size=103)
        assert got == max(speeds.values())
        assert torch.get_num_threads() == (1 if one_thread_faster else 2)
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


@pytest.mark.slow
def test_train_lm_without_a_model_uses_the_rule_and_keeps_explicit_settings(
    tmp_path, capsys, _cache
):
    common = ["--max-chars", "40000", "--no-progress", "--eval-batches", "1"]
    run = tmp_path / "auto"
    assert main(["train", "lm", *common, "--steps", "2", "--out", str(run)]) == 0
    assert "budget rule (2 steps): row xs" in capsys.readouterr().err
    cfg = json.loads((run / "config.json").read_text())
    n_train = cfg["task"]["n_tokens"]["train"]
    expect = choose_lm_settings(steps=2, corpus_tokens=n_train, optimizer="auto")
    assert cfg["train"]["optimizer"] == expect.optimizer == "muon"  # the rule's, for row xs
    assert cfg["model"]["d_model"] == expect.row.d_model
    assert cfg["model"]["position"] == "rope"
    assert cfg["task"]["seq_len"] == cfg["model"]["max_seq_len"] == expect.seq_len
    assert (cfg["train"]["batch_size"], cfg["train"]["lr"]) == (expect.batch_size, expect.lr)

    kept = tmp_path / "kept"
    argv = [*common, "--steps", "2", "--batch-size", "4", "--seq-len", "32", "--backend", "math"]
    assert main(["train", "lm", *argv, "--out", str(kept)]) == 0
    assert "seq 32, batch 4" in capsys.readouterr().err  # what the run uses is printed
    cfg = json.loads((kept / "config.json").read_text())
    assert cfg["train"]["batch_size"] == 4 and cfg["task"]["seq_len"] == 32
    assert cfg["model"]["backend"] == "math" and cfg["model"]["d_model"] == expect.row.d_model

    named = tmp_path / "named"
    argv = [*common, "--preset", "tiny", "--steps", "1", "--warmup", "0", "--out", str(named)]
    assert main(["train", "lm", *argv]) == 0
    assert "budget rule" not in capsys.readouterr().err
    assert json.loads((named / "config.json").read_text())["train"]["batch_size"] == 32
