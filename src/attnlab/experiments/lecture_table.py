"""The lecture's claims that ``attnlab experiment NAME`` runs through one runner, as data: each
experiment's parser words, budget, own flag rows and ``(run function, config class)``.

:mod:`attnlab.commands.experiments` registers them (the shared budget/output flags, then these
rows) and runs them; the measurements are the modules named in each row.
"""

from __future__ import annotations

import argparse

from attnlab.experiments.ablations import ROWS as ABLATION_ROWS
from attnlab.experiments.ablations import AblationsConfig, run_ablations
from attnlab.experiments.adaptive_computation import (
    AdaptiveComputationConfig,
    run_adaptive_computation,
)
from attnlab.experiments.exposure_bias import ExposureBiasConfig, run_exposure_bias
from attnlab.experiments.extrapolation import ExtrapolationConfig, run_extrapolation
from attnlab.experiments.grokking import GrokkingConfig, run_grokking
from attnlab.experiments.induction import InductionConfig, run_induction
from attnlab.experiments.label_smoothing import LabelSmoothingConfig, run_label_smoothing
from attnlab.experiments.long_context import LongContextConfig, run_long_context
from attnlab.experiments.norm_placement import NormPlacementConfig, run_norm_placement
from attnlab.experiments.sequence_primitives import (
    SequencePrimitivesConfig,
    run_sequence_primitives,
)
from attnlab.experiments.warmup import WarmupConfig, run_warmup

__all__ = ["experiments", "lm_model_rows"]


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _list_of(convert, what: str):
    """A ``type=`` for comma-separated values: ``_list_of(int, "whole numbers")("1,2")``."""

    def parse(text: str) -> tuple:
        try:
            return tuple(convert(x) for x in _split(text))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {what} separated by commas, got {text!r}"
            ) from None

    return parse


_floats = _list_of(float, "numbers")
_ints = _list_of(int, "whole numbers")


# fmt: off
def experiments() -> list[dict]:
    """Each experiment of this module: its parser's words, budget, own flags and
    ``(run function, config class)`` (``renamed``: config fields whose flag is named otherwise).

    ``lm`` holds the arguments of :func:`lm_model_rows` for the language-model experiments
    (``flags after lm`` follow that group on the usage line).
    """
    return [
        {
            "name": "exposure-bias",
            "help": "teacher forcing vs scheduled sampling: loss on own predictions, EM by length",
            "description": "Train rnn-attn and transformer on the numbers task with teacher "
            "forcing and with scheduled sampling (the gold-token probability decays linearly, "
            "exponentially or by inverse sigmoid), from the same initial weights for an equal "
            "share of the budget (or --steps each). Report the held-out NLL of the references "
            "under teacher forcing and when the decoder reads its own greedy predictions, the "
            "gap, greedy exact match by output length, and the error rate by output position "
            "(how fast free-running errors compound along the output, paired z against "
            "teacher forcing).",
            "max_time": 300.0,
            "flags": [
                ("--models", _split, ("rnn-attn", "transformer"),
                 "comma-separated kinds (default rnn-attn,transformer)"),
                ("--decays", _split, ("linear", "exponential", "inverse_sigmoid"),
                 "comma-separated scheduled-sampling decays (default all three)"),
                ("--half-at", float, 0.5,
                 "fraction of each run at which the gold probability reaches 1/2 (default 0.5)"),
                ("--lang", None, "it", None),
                ("--high", int, 10**6 - 1, "largest number (default 999999)"),
                ("--n-examples", int, 20_000, None),
                ("--batch-size", int, 64, None),
                ("--max-test", int, 1000, "held-out pairs scored"),
                ("--tgt-level", ["char", "bpe"], "char", "target tokens: char (4-54 per "
                 "reference, errors can compound; default) or bpe (at most 6)"),
                ("--position-bucket", int, 10,
                 "output positions per error-rate column (default 10)"),
            ],
            "run": (run_exposure_bias, ExposureBiasConfig),
        },
        {
            "name": "label-smoothing",
            "help": "label smoothing 0 / 0.1 / 0.2: accuracy, NLL, calibration (reliability "
            "diagram)",
            "description": "Train one translation model per label-smoothing value on a small "
            "numbers data set (same initial weights, equal shares of the budget) and report "
            "held-out token accuracy, NLL, expected calibration error with a reliability "
            "diagram, and exact match.",
            "max_time": 300.0,
            "flags": [
                ("--epsilons", _floats, (0.0, 0.1, 0.2),
                 "comma-separated smoothing values (default 0,0.1,0.2)"),
                ("--model", ["rnn", "rnn-attn", "transformer"], "transformer", None),
                ("--preset", None, "tiny", None),
                ("--lr", float, 1e-3, None),
                ("--lang", None, "it", None),
                ("--high", int, 10**6 - 1, None),
                ("--n-examples", int, 2000, "pairs generated (default 2000)"),
                ("--held-out", float, 0.9, "fraction held out, half validation, half test "
                 "(default 0.9: 200 training pairs, on which an unsmoothed model becomes "
                 "overconfident, and 900 test pairs)"),
                ("--batch-size", int, 32, None),
                ("--n-bins", int, 15, "confidence bins (default 15)"),
                ("--max-test", int, 1000, None),
            ],
            "run": (run_label_smoothing, LabelSmoothingConfig),
        },
        {
            "name": "extrapolation",
            "help": "learned / sinusoidal / RoPE / ALiBi positions: trained at L, evaluated at "
            "L, 2L, 4L",
            "description": "Train one DecoderLM per position scheme on windows of --context L "
            "characters of a built-in corpus (same seed, the same steps, fitted into "
            "--max-time), then score the same held-out text cut into windows of L, 2L and 4L: "
            "mean loss and loss by position (plot). A learned table of L rows cannot read past "
            "L: its cells say 'n/a: table has L rows'.",
            "max_time": 240.0,
            "flags": [
                ("--positions", _split, ("learned", "sinusoidal", "rope", "alibi", "t5"),
                 "comma-separated schemes (default learned,sinusoidal,rope,alibi,t5)"),
                ("--context", int, 64, "training window L (default 64)"),
                ("--lengths", _ints, (1, 2, 4),
                 "evaluated lengths as multiples of L (default 1,2,4)"),
            ],
            "lm": {"lr": 2e-3},
            "flags after lm": [
                ("--eval-windows", int, 128,
                 "held-out windows of the longest length scored (default 128)"),
            ],
            "run": (run_extrapolation, ExtrapolationConfig),
        },
        {
            "name": "norm-placement",
            "help": "post-norm vs pre-norm by depth, with and without warm-up: divergence, "
            "final loss, per-layer gradient norms at initialisation",
            "description": "Train DecoderLMs with post-norm and pre-norm blocks at several "
            "depths at one learning rate (AdamW, constant after the warm-up, no gradient "
            "clipping), each without and with a linear warm-up (same seed, the same steps, "
            "fitted into --max-time). Report whether training diverged (a non-finite loss, a "
            "loss that blew up: rose more than 1 nat above the first step's, or a loss that "
            "ended no lower than it started), the final training loss, and the gradient norm "
            "of every block's parameters at initialisation.",
            "max_time": 240.0,
            "flags": [
                ("--depths", _ints, (2, 6, 12), "comma-separated layer counts (default 2,6,12; "
                 "the issue's 24 fits a larger --max-time)"),
                ("--warmup-frac", float, 0.2, "linear warm-up as a fraction of each run, for "
                 "the warmed-up runs (default 0.2)"),
            ],
            "lm": {"lr": 1e-2, "context": 32},
            "run": (run_norm_placement, NormPlacementConfig),
        },
        {
            "name": "warmup",
            "help": "Adam with and without linear warm-up across peak learning rates: how often "
            "early training diverges, and the loss reached",
            "description": "Train a DecoderLM (AdamW, no gradient clipping) at each peak "
            "learning rate, with and without a linear warm-up (constant rate afterwards), over "
            "several seeds (--seed, --seed+1, ...), for the same steps (fitted into "
            "--max-time). Report how many seeds diverged (a non-finite loss, a loss that blew "
            "up: rose more than 1 nat above the first step's, or a loss that ended no lower "
            "than it started) and the final training loss.",
            "max_time": 240.0,
            "flags": [
                ("--lrs", _floats, (1e-2, 3e-2, 1e-1, 3e-1),
                 "comma-separated peak learning rates (default 0.01,0.03,0.1,0.3)"),
                ("--seeds", int, 3, "seeds per setting (default 3)"),
                ("--warmup-frac", float, 0.2,
                 "linear warm-up as a fraction of each run (default 0.2)"),
                ("--n-layers", int, 4, "depth (default 4)"),
                ("--norm", ["post", "pre"], "post",
                 "norm placement of the blocks (default post, the original Transformer's)"),
            ],
            "lm": {"lr": None, "context": 32},
            "run": (run_warmup, WarmupConfig),
            "renamed": {"norm_position": "norm"},
        },
        {
            "name": "grokking",
            "help": "a + b mod p with a one-layer Transformer, with and without weight decay: "
            "train acc saturates, test acc rises much later (with decay only)",
            "description": "Train a one-layer DecoderLM on a fraction of all pairs of a + b mod p "
            "(inputs a, b, '=' = token p; the answer read at the last position), full-batch "
            "AdamW, once per weight decay from the same initial weights for the same number of "
            "steps (fitted into --max-time by the first run, or --steps). Report train/test "
            "accuracy and loss over steps (log-scale plot), the steps where train accuracy "
            "passes 99 %% and test accuracy 95 %%, and the share of the embedding's squared "
            "norm in its --top-k largest Fourier frequencies at the start, at memorisation, "
            "at generalisation and at the end.",
            "max_time": 150.0,
            "flags": [
                ("--p", int, 23, "the modulus (default 23; Nanda et al. use 113)"),
                ("--train-fraction", float, 0.7, "share of the p² pairs that trains "
                 "(default 0.7; Nanda et al. use 0.3, which groks far later)"),
                ("--weight-decays", _floats, (1.0, 0.0),
                 "comma-separated AdamW weight decays, one run each (default 1,0)"),
                ("--d-model", int, 32, None),
                ("--ffn-hidden", int, 128, None),
                ("--lr", float, 3e-3, "AdamW learning rate (default %(default)s)"),
                ("--top-k", int, 4, "frequencies counted as the few largest (default 4)"),
                ("--threads", int, 1, "torch CPU threads (default 1: tiny models, and much "
                 "faster than all cores on a busy machine)"),
            ],
            "run": (run_grokking, GrokkingConfig),
        },
        {
            "name": "induction-heads",
            "help": "attention-only Transformers of 1 and 2 layers on repeated spans (random "
            "tokens, pydoc): prefix-matching and previous-token scores, second-copy loss, ablation",
            "description": "Train attention-only DecoderLMs (ffn none) of each depth on windows "
            "(random tokens, and pydoc by characters) in which a span of random length repeats "
            "to the end (same seed, the same steps per setting, fitted into --max-time by the "
            "deepest, or --steps). Measure over training, on repeated random tokens [r, r]: "
            "each head's prefix-matching score, the previous-token scores, the loss on the "
            "second copy against ln V and the in-context-learning score; at the end "
            "zero-ablate the 2-layer model's previous-token head (and a control head) and "
            "measure again.",
            "max_time": 300.0,
            "flags": [
                ("--layers", _ints, (1, 2), "comma-separated depths (default 1,2)"),
                ("--settings", _split, ("random", "pydoc"),
                 "comma-separated base sequences: random tokens, pydoc characters (default both)"),
                ("--vocab-size", int, 32, "random tokens (default 32)"),
                ("--seq-len", int, 32, "window T, even (default 32)"),
                ("--d-model", int, 128, None),
                ("--n-heads", int, 4, "heads per layer (default 4)"),
                ("--batch-size", int, 32, None),
                ("--lr", float, 1e-3, "AdamW learning rate (default %(default)s)"),
                ("--position", ["rope", "learned", "alibi"], "rope", None),
                ("--min-span", float, 0.125,
                 "shortest repeated span as a fraction of the window (default 0.125)"),
                ("--max-span", float, 0.5,
                 "longest repeated span as a fraction of the window (default 0.5)"),
                ("--max-chars", int, None, "characters of pydoc read (default all)"),
                ("--threshold", float, 0.3,
                 "prefix-matching score of an induction head (default 0.3)"),
                ("--threads", int, 1, "torch CPU threads (default 1: tiny models, and much "
                 "faster than all cores on a busy machine)"),
            ],
            "run": (run_induction, InductionConfig),
        },
        {
            "name": "ablations",
            "help": "one part taken out of a tiny LM: the causal mask, heads at equal width, "
            "MoE load balancing, QK-norm and clipping at a high learning rate, LayerNorm vs "
            "BatchNorm, the residual connections, positions concatenated instead of added",
            "description": "Train variants of a tiny DecoderLM on pydoc characters from the same "
            "seed for the same steps (fitted into --max-time, or --steps): with and without the "
            "causal mask (teacher-forced loss against the loss where generation reads it), one "
            "head against several at equal width, a mixture of experts with and without the "
            "load-balancing loss (expert load, dead experts), QK-norm and gradient clipping at "
            "a high learning rate (gradient spikes), LayerNorm against BatchNorm (how much a "
            "window's outputs depend on the rest of its batch, padding and later positions), "
            "a deep stack with and without residual connections (per-layer gradient norms) and "
            "positions concatenated to the token embedding against added at equal width.",
            "max_time": 300.0,
            "flags": [
                ("--rows", _split, ABLATION_ROWS,
                 f"comma-separated rows (default {','.join(ABLATION_ROWS)})"),
                ("--seq-len", int, 64, "window T (default 64)"),
                ("--d-model", int, 64, None),
                ("--n-layers", int, 2, None),
                ("--n-heads", int, 4, "heads of the multi-head variants (default 4)"),
                ("--n-experts", int, 8, None),
                ("--top-k", int, 2, None),
                ("--batch-size", int, 32, None),
                ("--lr", float, 3e-3, "AdamW learning rate (default %(default)s)"),
                ("--high-lr", float, 3e-2,
                 "learning rate of the qk-norm and clipping rows (default %(default)s)"),
                ("--position", ["rope", "learned", "alibi"], "rope",
                 "positions of every row but positions-concat (default rope)"),
                ("--deep-layers", int, 8, "depth of the residual row (default 8)"),
                ("--pos-width", int, None, "width of the concatenated position code, "
                 "positions-concat row (default d_model / 4)"),
                ("--max-chars", int, None, "characters of pydoc read (default all)"),
                ("--threads", int, 1, "torch CPU threads (default 1)"),
            ],
            "run": (run_ablations, AblationsConfig),
        },
    {
        "name": "long-context",
        "help": "documents longer than the segment: disjoint chunks, sliding windows, "
        "Transformer-XL memory, full attention; loss and cost per token",
        "description": "Train one Transformer-XL on segments of --segment L characters (memory "
        "carried from segment to segment), then score the same held-out documents of "
        "--doc-len characters as disjoint chunks of L, sliding windows of L with --stride, "
        "windows of M+L recomputed per segment, windows of L per token (stride 1), segments "
        "with the memory, and one full-attention segment: loss, query rows and keys per token "
        "(counted) and evaluation time per token (measured, on the machine as it is).",
        "max_time": 240.0,
        "flags": [
            ("--segment", int, 32, "segment length L (default 32)"),
            ("--mem-len", int, None, "memory M (default: L)"),
            ("--doc-len", int, 256, "held-out document length N (default 256)"),
            ("--n-docs", int, 32, "held-out documents (default 32)"),
            ("--stride", int, None, "sliding-window stride (default L/4)"),
            ("--d-model", int, 64, None),
            ("--n-layers", int, 2, None),
            ("--batch-size", int, 16, "text streams per step (default 16)"),
            ("--lr", float, 2e-3, None),
            ("--data", None, "pydoc", "corpus, read by characters (default pydoc)"),
            ("--max-chars", int, None, "use only the first N characters"),
            ("--threads", int, None, "torch CPU threads (default: torch's, all cores; 1 is much "
             "faster on a busy machine)"),
        ],
        "run": (run_long_context, LongContextConfig),
    },
    {
        "name": "adaptive-computation",
        "help": "a Universal Transformer with ACT on parity strings of varying length: steps "
        "by difficulty, accuracy against a fixed depth of equal average compute",
        "description": "Train a Universal Transformer (one shared block) with adaptive "
        "computation time on parity of 1 … --max-len bits, then a fixed-depth model with the "
        "same block, as many steps as the ACT model's mean, for as many optimizer steps. "
        "Report the ACT steps per length (over positions and at [CLS]), both models' "
        "held-out accuracy per length, and the rank correlation of length and steps.",
        "max_time": 240.0,
        "flags": [
            ("--max-len", int, 6, "longest bit string (default 6)"),
            ("--max-steps", int, 8, "the ACT ponder budget N_max (default 8)"),
            ("--ponder-cost", float, 0.001, "τ (default 0.001)"),
            ("--halting-bias", float, -1.0,
             "initial bias of the halting unit (default -1: about 4 steps at first)"),
            ("--d-model", int, 64, None),
            ("--batch-size", int, 64, None),
            ("--lr", float, 1e-3, None),
            ("--n-test", int, 200, "held-out strings per length (default 200)"),
            ("--threads", int, None, "torch CPU threads (default: torch's, all cores; 1 is much "
             "faster on a busy machine)"),
        ],
        "run": (run_adaptive_computation, AdaptiveComputationConfig),
    },
    {
        "name": "sequence-primitives",
        "help": "LSTM vs causal dilated CNN vs Transformer at equal parameters: recall accuracy "
        "by distance, time per step by length, gradient norm by distance",
        "description": "Build an LSTM, a causal dilated-convolution LM and a DecoderLM (RoPE) "
        "with widths matched to --params parameters, time a training step of each by sequence "
        "length, train each for the same steps on the same batches of recall at a distance "
        "(a key D positions before the last must be predicted there), then measure held-out "
        "accuracy by D (the CNN is at chance past its receptive field R = 1 + sum (k-1) d) and "
        "the norm of the gradient of the last logits with respect to the key's embedding by D.",
        "max_time": 240.0,
        "flags": [
            ("--models", _split, ("lstm", "cnn", "transformer"),
             "comma-separated models (default lstm,cnn,transformer)"),
            ("--params", int, 50_000, "parameter count every width is matched to (default "
             "50000)"),
            ("--max-distance", int, 64, "longest distance trained; sequences are one longer "
             "(default 64)"),
            ("--distances", _ints, None,
             "comma-separated distances evaluated (default 1, 2, 4, ..., R-1, R, max)"),
            ("--n-keys", int, 8, "key symbols; chance is 1/n-keys (default 8)"),
            ("--n-fillers", int, 1, "filler symbols (default 1: the same filler everywhere; more "
             "make the task harder for the LSTM and the CNN)"),
            ("--kernel-size", int, 3, "the CNN's kernel (default 3)"),
            ("--dilations", _ints, (1, 2, 4, 8),
             "the CNN's dilations, one layer each (default 1,2,4,8: R = 31)"),
            ("--n-layers", int, 2, "the Transformer's layers (default 2)"),
            ("--n-heads", int, 2, "the Transformer's heads (default 2)"),
            ("--batch-size", int, 32, None),
            ("--lr", float, 5e-3, "AdamW learning rate (default %(default)s)"),
            ("--n-test", int, 256, "held-out sequences per distance (default 256)"),
            ("--lengths", _ints, (64, 128, 256, 512, 1024),
             "comma-separated sequence lengths timed (default 64,...,1024)"),
            ("--threads", int, None, "torch CPU threads (default: torch's, all cores; 1 is much "
             "faster on a busy machine)"),
        ],
        "run": (run_sequence_primitives, SequencePrimitivesConfig),
    },
    ]


def lm_model_rows(*, lr: float | None, context: int | None = None) -> list[tuple]:
    """The "model and data" flag rows of the language-model experiments."""
    rows = [
        ("--preset", None, "tiny", "DecoderLM preset (default tiny)"),
        ("--d-model", int, None, "model width (default: the preset's)"),
    ]
    if context is not None:
        rows.append(("--context", int, context, f"training window (default {context})"))
    if lr is not None:
        rows.append(("--lr", float, lr, "peak learning rate (default %(default)s)"))
    rows += [
        ("--batch-size", int, 16, "windows per step (default 16)"),
        ("--data", None, "pydoc", "corpus, read by characters (default pydoc)"),
        ("--max-chars", int, None, "use only the first N characters"),
        ("--threads", int, None,
         "torch CPU threads (default: torch's, all cores; 1 is much faster on a busy machine)"),
    ]
    return rows


# fmt: on
