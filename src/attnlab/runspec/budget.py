"""Language-model settings from a budget: model size, batch, window, learning rate, warm-up.

A fixed default cannot fit every budget: 95 s of a 4 × 128 model at 32 × 128 tokens per step is
only 568 updates on two CPU cores, while the same time buys 2000 updates of 12 × 64 tokens, and
at short budgets the number of updates matters more than their size (issue 12: 1.795 against
1.333 nats/char on pydoc). :func:`choose_lm_settings` picks one row of a table (:data:`ROWS`,
produced by ``benchmarks/budget_sweep.py``) by this rule:

1. Budget in *reference steps*: ``R = budget_s × ref_steps_per_s``, the training steps per
   second this machine makes with the reference row (``s``, measured by
   :func:`measure_ref_steps_per_s` in about a second), or ``R = steps`` for a step budget.
2. A row's step costs ``c = α + (1 − α) · F_row / F_ref`` reference steps, where ``F`` is the
   FLOPs of a step (``B·T·(6·N + 12·L·T·d)``, PaLM appendix B) and ``α = 0.35`` the share of the
   reference step that does not scale with FLOPs (Python, optimizer, small kernels). So a row can
   make ``R / c`` steps in the budget (``steps`` itself in a step budget).
3. Choose the largest row that can make at least its ``min_steps`` (below that a bigger model is
   still undertrained: the sweep shows the smaller one ahead) and whose parameters are at most
   ``MAX_PARAMS_PER_TOKEN`` × the corpus's training tokens (a larger model only memorises).
4. Warm-up: the row's, at most a tenth of the run. Dropout from the expected passes over the
   corpus, weighted by how much of it the model could store (``min(1, parameters / training
   tokens)``: a model far smaller than its corpus cannot memorise it): 0 up to 10 weighted
   epochs, 0.1 up to 30, then 0.2.

Monotone by construction: a larger budget makes every row's step count larger, so the set of
rows allowed only grows and the choice is never a smaller model. Deterministic and pure (the
measurement is a separate function). Rows ``xs``, ``s`` and ``m`` (learning rates and the
budgets where each passes the one below) come from ``benchmarks/budget_sweep.py`` on a 2-core
CPU at 30-300 s (its table: docs/performance.md); the larger rows, out of reach there, are
interpolated or taken from nanoGPT's recipes (the ``source`` of each row).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.config.lm import PRESETS, ModelConfig
from attnlab.models.lm import DecoderLM

__all__ = [
    "BudgetRow",
    "LMBudgetChoice",
    "ROWS",
    "REFERENCE",
    "REFERENCE_STEPS_PER_S",
    "choose_lm_settings",
    "row_cost",
    "row_params",
    "row_warmup",
    "measure_ref_steps_per_s",
    "fastest_ref_steps_per_s",
]

#: share of the reference step that does not scale with FLOPs (see the module docstring)
FIXED_SHARE = 0.35
#: a model may have at most this many parameters per training token of the corpus
MAX_PARAMS_PER_TOKEN = 12.0
#: the character vocabulary assumed when none is given (pydoc has 103 characters)
DEFAULT_VOCAB = 128


@dataclass(frozen=True)
class BudgetRow:
    """One row of the budget table: a GPT-2-style model with RoPE and its training settings.

    Attributes:
        name: short name (``xs`` … ``xxl``).
        n_layers, d_model, n_heads: the model's size.
        seq_len: the training window T (= the context).
        batch_size: sequences per step B.
        lr: peak learning rate (cosine to a tenth, AdamW betas (0.9, 0.95), weight decay 0.1).
        warmup_steps: linear warm-up.
        min_steps: the fewest steps for which this row beats the row below it.
        source: where the numbers come from.
        lr_with_muon: the peak rate of the AdamW part (embeddings, norms, the tied head) when
            the hidden matrices train with Muon (``optimizer="muon"``), where measured
            (``benchmarks/demo_recipes.py``); None: ``lr``.
        min_steps_with_muon: ``min_steps`` when the hidden matrices train with Muon, where
            measured (Muon makes a larger model pay from fewer steps); None: ``min_steps``.
        token_shift: the model's token shift (:class:`~attnlab.config.ModelConfig`
            ``token_shift``), where measured to pay: row xs (``benchmarks/speedrun.py``, 3
            seeds: 0.010 nats/char at 75 s with Muon, 0.035 with AdamW; 0.018 per token at the
            demo's 1.2M tokens). Row s, measured with Muon, was ahead with it at 150 s (0.009,
            3 seeds) and behind at 300 s (0.007, 5 seeds), so it goes without. The crossings
            ``min_steps*`` were measured without it.
    """

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    batch_size: int
    lr: float
    warmup_steps: int
    min_steps: int
    source: str = ""
    lr_with_muon: float | None = None
    min_steps_with_muon: int | None = None
    token_shift: bool = False

    def model_fields(self) -> dict[str, Any]:
        """The :class:`attnlab.config.ModelConfig` fields (a ``gpt2-mini``-style model, RoPE,
        the row's token shift)."""
        return {
            **PRESETS["gpt2-mini"],
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "position": "rope",
            "max_seq_len": self.seq_len,
            "token_shift": self.token_shift,
        }


#: the table, smallest model first (see the module docstring for how a row is chosen)
ROWS: tuple[BudgetRow, ...] = (
    BudgetRow(
        "xs",
        2,
        64,
        4,
        64,
        12,
        4e-3,
        50,
        0,
        "sweep: best at 30-150 s (1.263 at 150 s); with Muon, 880 steps: lr 0.02 1.316, "
        "0.03 1.318, 4e-3 1.380 nats/char",
        lr_with_muon=0.02,
        token_shift=True,
    ),
    BudgetRow(
        "s",
        4,
        128,
        4,
        64,
        12,
        4e-3,
        100,
        3000,
        "sweep: ahead of xs from about 200 s (1.248 at 300 s); with Muon, 880 steps: lr 0.02 "
        "1.245, 4e-3 1.263 nats/char; with Muon against xs with Muon, one thread at 13.8 "
        "reference steps/s: behind at 45 s (621 reference steps: 1.367 vs 1.270), ahead at "
        "100 s (1,380: 1.234 vs 1.246) and 161 s (2,222: 1.210 vs 1.252)",
        lr_with_muon=0.02,
        min_steps_with_muon=1300,
    ),
    BudgetRow(
        "m", 4, 192, 6, 128, 16, 4e-3, 150, 2000, "sweep: 0.06 behind s at 300 s; interpolated"
    ),
    BudgetRow("l", 6, 256, 8, 128, 32, 8e-4, 200, 3000, "interpolated"),
    BudgetRow(
        "xl", 6, 384, 6, 256, 64, 1e-3, 200, 4000, "nanoGPT shakespeare_char (1M chars, 5000 it.)"
    ),
    BudgetRow("xxl", 8, 512, 8, 256, 64, 6e-4, 400, 6000, "extrapolated"),
)
#: the row whose speed is measured
REFERENCE = ROWS[1]
#: reference steps per second on the machine of issue 12 (2 cores: 2000 steps in 89 s)
REFERENCE_STEPS_PER_S = 2000 / 89


def row_params(row: BudgetRow, vocab_size: int = DEFAULT_VOCAB) -> int:
    """Parameters of a row's model (tied embeddings, learned norms and biases included)."""
    L, d = row.n_layers, row.d_model
    per_block = 12 * d * d + 13 * d  # Q, K, V, O (4d² + 4d), MLP (8d² + 5d), two norms (4d)
    return L * per_block + vocab_size * d + 2 * d


def _step_flops(row: BudgetRow, vocab_size: int) -> float:
    L, d, T = row.n_layers, row.d_model, row.seq_len
    n_matmul = 12 * L * d * d + vocab_size * d
    return row.batch_size * T * (6 * n_matmul + 12 * L * T * d)


def row_cost(row: BudgetRow, vocab_size: int = DEFAULT_VOCAB) -> float:
    """A row's step time in reference steps: ``α + (1 − α) · F_row / F_ref``."""
    ratio = _step_flops(row, vocab_size) / _step_flops(REFERENCE, vocab_size)
    return FIXED_SHARE + (1.0 - FIXED_SHARE) * ratio


@dataclass(frozen=True)
class LMBudgetChoice:
    """What :func:`choose_lm_settings` picked, and why.

    Attributes:
        row: the table row.
        model: :class:`attnlab.config.ModelConfig` fields (``vocab_size`` left to the tokenizer).
        seq_len, batch_size, lr, warmup_steps, dropout: the training settings.
        steps: the steps expected in a time budget (the given ones in a step budget).
        tokens: training tokens expected (``steps × batch_size × seq_len``).
        epochs: expected passes over the corpus's training tokens.
        reference_steps: the budget in reference steps.
        optimizer: ``TrainConfig.optimizer`` (the given one, or the rule's: see
            :func:`choose_lm_settings`).
    """

    row: BudgetRow
    model: dict[str, Any] = field(repr=False)
    seq_len: int
    batch_size: int
    lr: float
    warmup_steps: int
    dropout: float
    steps: int
    tokens: int
    epochs: float
    reference_steps: float
    optimizer: str = "adamw"

    def describe(self) -> str:
        """One line for the start of a run."""
        r = self.row
        muon = ", Muon" if self.optimizer == "muon" else ""
        shift = ", token shift" if self.model.get("token_shift") else ""
        return (
            f"row {r.name}: {r.n_layers} layers x {r.d_model} (RoPE{shift}{muon}), seq {self.seq_len}, "
            f"batch {self.batch_size}, lr {self.lr:g}, warm-up {self.warmup_steps}, dropout "
            f"{self.dropout:g}; about {self.steps:,} steps = {self.tokens / 1e6:.1f}M tokens "
            f"({self.epochs:.1f} epochs)"
        )


def row_warmup(row: BudgetRow, steps: int) -> int:
    """A row's warm-up for a run of ``steps``: the row's, at most a tenth of the run."""
    return max(1, min(row.warmup_steps, steps // 10))


def _dropout(epochs: float) -> float:
    return 0.0 if epochs <= 10 else 0.1 if epochs <= 30 else 0.2


def choose_lm_settings(
    *,
    budget_s: float | None = None,
    steps: int | None = None,
    corpus_tokens: int,
    ref_steps_per_s: float | None = None,
    vocab_size: int = DEFAULT_VOCAB,
    rows: tuple[BudgetRow, ...] = ROWS,
    optimizer: str = "adamw",
) -> LMBudgetChoice:
    """Pick model size, batch, window, learning rate, warm-up and dropout for a budget.

    Args:
        budget_s: wall-clock seconds of training (wins over ``steps`` when both are given).
        steps: optimizer steps, when the budget is a step count.
        corpus_tokens: training tokens in the corpus.
        ref_steps_per_s: steps per second of the reference row on this machine
            (:func:`measure_ref_steps_per_s`); default: the 2-core machine of issue 12.
        vocab_size: the tokenizer's vocabulary (for the FLOPs and parameter counts).
        rows: the table, smallest first.
        optimizer: ``TrainConfig.optimizer``; with ``"muon"`` a row's ``min_steps_with_muon``
            and ``lr_with_muon`` replace its ``min_steps`` and ``lr`` where it has them (the
            latter is the rate of the AdamW part). ``"auto"``: the rule's own choice, Muon
            where the chosen row was measured with it (``lr_with_muon``: rows xs and s, where
            ``benchmarks/speedrun.py`` measured it ahead of AdamW at 75-300 s), else AdamW.

    Returns:
        An :class:`LMBudgetChoice`.

    Raises:
        ValueError: no budget, a non-positive budget, corpus or speed.
    """
    if budget_s is None and steps is None:
        raise ValueError("give a budget: budget_s (seconds) or steps")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s}")
    if budget_s is None and not steps >= 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not corpus_tokens >= 1:
        raise ValueError(f"corpus_tokens must be >= 1, got {corpus_tokens}")
    speed = REFERENCE_STEPS_PER_S if ref_steps_per_s is None else ref_steps_per_s
    if not speed > 0:
        raise ValueError(f"ref_steps_per_s must be > 0, got {ref_steps_per_s}")
    reference_steps = budget_s * speed if budget_s is not None else float(steps)

    def steps_of(row: BudgetRow) -> int:
        if budget_s is None:
            return int(steps)
        return max(1, int(reference_steps / row_cost(row, vocab_size)))

    def settings(optimizer: str) -> LMBudgetChoice:
        """The rule's choice for one optimizer."""

        def with_muon(own, measured):  # a row's value, or its Muon value where it has one
            return measured if optimizer == "muon" and measured is not None else own

        chosen = rows[0]
        for row in rows[1:]:
            fits_corpus = row_params(row, vocab_size) <= MAX_PARAMS_PER_TOKEN * corpus_tokens
            if fits_corpus and steps_of(row) >= with_muon(row.min_steps, row.min_steps_with_muon):
                chosen = row
        n_steps = steps_of(chosen)
        tokens = n_steps * chosen.batch_size * chosen.seq_len
        epochs = tokens / corpus_tokens
        dropout = _dropout(epochs * min(1.0, row_params(chosen, vocab_size) / corpus_tokens))
        return LMBudgetChoice(
            row=chosen,
            model={**chosen.model_fields(), "dropout": dropout},
            seq_len=chosen.seq_len,
            batch_size=chosen.batch_size,
            lr=with_muon(chosen.lr, chosen.lr_with_muon),
            warmup_steps=row_warmup(chosen, n_steps),
            dropout=dropout,
            steps=n_steps,
            tokens=tokens,
            epochs=epochs,
            reference_steps=reference_steps,
            optimizer=optimizer,
        )

    if optimizer != "auto":
        return settings(optimizer)
    muon = settings("muon")  # Muon where the row chosen was measured with it, else AdamW's choice
    return muon if muon.row.lr_with_muon is not None else settings("adamw")


def measure_ref_steps_per_s(
    *, vocab_size: int = DEFAULT_VOCAB, device: str | torch.device = "cpu", seconds: float = 1.0
) -> float:
    """Training steps per second of the reference row on this machine (about ``seconds``).

    Full steps: forward, cross-entropy, backward, clipping and a fused AdamW update on random
    tokens, after two warm-up steps; a low quartile of at least three. The random-number state is
    saved and restored, so measuring does not change a seeded run.
    """
    row = REFERENCE
    rng = torch.get_rng_state()
    try:
        torch.manual_seed(0)
        model = DecoderLM(ModelConfig.from_dict({**row.model_fields(), "vocab_size": vocab_size}))
        model.to(device).train()
        fused = torch.device(device).type in ("cpu", "cuda")
        opt = torch.optim.AdamW(model.parameters(), lr=row.lr, fused=fused or None)
        x = torch.randint(0, vocab_size, (row.batch_size, row.seq_len + 1), device=device)

        def step() -> None:
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()

        for _ in range(2):
            step()
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - start < seconds:
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
            if len(times) >= 200:
                break
    finally:
        torch.set_rng_state(rng)
    times.sort()
    return 1.0 / times[len(times) // 4]  # a low quartile: a busy machine's spikes left out


def fastest_ref_steps_per_s(
    *, vocab_size: int = DEFAULT_VOCAB, device: str | torch.device = "cpu", seconds: float = 1.0
) -> float:
    """:func:`measure_ref_steps_per_s`; on a CPU with torch's threads and with one, **leaving
    torch on the faster** (on a machine whose cores are busy with other work, threads that wait
    for each other can make a step several times slower than one thread). Returns its speed."""
    speed = measure_ref_steps_per_s(vocab_size=vocab_size, device=device, seconds=seconds)
    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu" and threads > 1:
        torch.set_num_threads(1)
        one = measure_ref_steps_per_s(vocab_size=vocab_size, device=device, seconds=seconds)
        if one > speed:
            return one  # keep one thread
        torch.set_num_threads(threads)
    return speed
