"""Long inputs, measured: one Transformer-XL LM read four ways over documents longer than its
segment, at the same segment length L.

The lecture's list of variants names two answers to inputs longer than the context: cut them
into (overlapping) chunks and process each on its own, which loses every interaction across a
cut, or carry a memory from one segment to the next (Transformer-XL). One model, trained with
memory on segments of L characters, scores the same held-out documents of N > L characters as

- ``disjoint``: chunks of L, each read alone (the first tokens of every chunk have no context);
- ``sliding``: windows of L moved by a stride s < L, each token scored once in the window where
  it has at least L − s tokens of context (Hugging Face's perplexity recipe): L/s times the work;
- ``recompute``: windows of M + L moved by L: every segment re-reads its M predecessors from
  scratch, the span a memory of M gives the first layer, without the memory;
- ``stride-1``: windows of L moved by one token, each token with L − 1 tokens of context
  recomputed for it alone (the vanilla Transformer's evaluation in Dai et al. 2019, §4);
- ``memory``: segments of L in order, each layer attending to the previous segment's states
  (Transformer-XL, memory M);
- ``full``: the whole document as one segment (attention over all N tokens), where N fits the
  model's ``max_seq_len``.

Per reading: the mean next-token loss on the same tokens, query rows computed and (query, key)
pairs scored per token (per layer; counted, not estimated), and the measured evaluation time per
token, on whatever the machine is doing besides (the rows and pairs are the load-free measure).

Outputs: ``table.md``, ``results.json``, ``loss_by_position.png`` (loss at each position of the
document, per reading) and the trained model as a run directory, ``runs/xl``.

Shape legend: D documents, N document length, L segment, M memory, V vocab_size.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.config.base import Config
from attnlab.config.variants import TransformerXLConfig
from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.experiments.lm_runs import lm_task
from attnlab.fileio import atomic_write_text
from attnlab.layers import evaluating
from attnlab.models.transformer_xl import TransformerXL
from attnlab.plotting import pyplot, save_png
from attnlab.runs import save_model
from attnlab.tasks.lm_xl import streams as text_streams
from attnlab.train.distributed import resolve_device

__all__ = ["LongContextConfig", "run_long_context", "Reading", "read_sliding", "read_memory"]

log = logging.getLogger(__name__)


@dataclass
class LongContextConfig(Config):
    """Settings of the long-context experiment.

    Args:
        max_time: seconds for the whole experiment (training takes what evaluation leaves).
        steps: train for exactly this many steps instead (repeatable).
        segment: L, the segment (and chunk) length in characters.
        mem_len: M, the memory (default: L).
        doc_len: N, the length of each held-out document.
        n_docs: D, held-out documents scored.
        stride: the sliding window's stride s (default L/4).
        d_model, n_layers, n_heads: the model's size.
        batch_size: text streams read in parallel while training.
        lr: AdamW's learning rate (linear warm-up, then constant).
        data, max_chars: the corpus, read by characters.
        reserve: share of ``max_time`` kept for evaluation and the plot.
        device, seed, progress: as for training.
    """

    max_time: float = 240.0
    steps: int | None = None
    segment: int = 32
    mem_len: int | None = None
    doc_len: int = 256
    n_docs: int = 32
    stride: int | None = None
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    batch_size: int = 16
    lr: float = 2e-3
    data: str = "pydoc"
    max_chars: int | None = None
    reserve: float = 0.35
    device: str = "auto"
    seed: int = 0
    progress: bool = True

    def validate(self) -> None:
        super().validate()
        self.positive("max_time", "steps", "segment", "doc_len", "n_docs", "d_model")
        self.positive("n_layers", "n_heads", "batch_size", "lr")
        if self.mem_len is None:
            self.mem_len = self.segment
        if self.stride is None:
            self.stride = max(1, self.segment // 4)
        self.positive("mem_len", "stride")
        for name in ("lr",):
            if not math.isfinite(getattr(self, name)):
                raise UserError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        common.at_most(self, segment=1 << 14, mem_len=1 << 14, doc_len=1 << 16, n_docs=1 << 14,
                       d_model=4096, n_layers=64, n_heads=64, batch_size=1 << 12)  # fmt: skip
        if self.stride > self.segment:
            raise UserError(f"stride={self.stride} must not exceed the segment {self.segment}")
        if self.doc_len <= self.segment:
            raise UserError(
                f"doc_len={self.doc_len} must be longer than the segment {self.segment}: the "
                "experiment is about documents that do not fit one segment"
            )


@dataclass
class Reading:
    """One way of reading the documents: its per-position losses and its cost.

    Attributes:
        nll: ``(D, N)`` next-token loss at every position.
        rows: query rows computed (every forward's T, summed over forwards and documents).
        pairs: (query, key) pairs scored, per layer.
        seconds: wall-clock evaluation time.
    """

    nll: Tensor
    rows: int
    pairs: int
    seconds: float

    def summary(self) -> dict:
        n = self.nll.numel()
        return {
            "loss": float(self.nll.mean()),
            "rows_per_token": self.rows / n,
            "keys_per_token": self.pairs / n,
            "ms_per_1k_tokens": 1e6 * self.seconds / n,
            "by_position": [round(float(v), 4) for v in self.nll.mean(0)],
        }


def _pairs(T: int, M: int) -> int:
    """(query, key) pairs of one causal forward of T queries after M memory keys."""
    return T * M + T * (T + 1) // 2


def _nll(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view(
        targets.shape
    )


@torch.no_grad()
def read_sliding(model: TransformerXL, docs: Tensor, window: int, stride: int) -> Reading:
    """Windows of ``window`` tokens, the next one ending ``stride`` later, each read alone; each
    token scored in the first window that ends at or after it (``stride == window``: disjoint
    chunks).

    Args:
        docs: ``(D, N + 1)`` token ids (inputs and the shifted targets).
    """
    D, N = docs.shape[0], docs.shape[1] - 1
    nll = torch.empty(D, N)
    rows = pairs = 0
    start = time.perf_counter()
    done = 0  # tokens scored so far
    end = min(window, N)
    while done < N:
        begin = max(0, end - window)
        idx, tgt = docs[:, begin:end], docs[:, begin + 1 : end + 1]
        logits = model(idx).out  # (D, end - begin, V)
        keep = end - done  # the tokens this window scores: its last ones
        nll[:, done:end] = _nll(logits[:, -keep:], tgt[:, -keep:]).cpu()
        rows += D * (end - begin)
        pairs += D * _pairs(end - begin, 0)
        done, end = end, min(end + stride, N)
    return Reading(nll, rows, pairs, time.perf_counter() - start)


@torch.no_grad()
def read_memory(model: TransformerXL, docs: Tensor, segment: int) -> Reading:
    """Segments of ``segment`` tokens in order, each reading the previous ones' memory."""
    D, N = docs.shape[0], docs.shape[1] - 1
    nll = torch.empty(D, N)
    rows = pairs = 0
    memory = None
    start = time.perf_counter()
    for begin in range(0, N, segment):
        end = min(begin + segment, N)
        M = 0 if memory is None else memory[0].shape[1]
        logits, memory = model(docs[:, begin:end], memory=memory)
        nll[:, begin:end] = _nll(logits, docs[:, begin + 1 : end + 1]).cpu()
        rows += D * (end - begin)
        pairs += D * _pairs(end - begin, M)
    return Reading(nll, rows, pairs, time.perf_counter() - start)


def train_xl(
    model: TransformerXL,
    ids: np.ndarray,
    cfg: LongContextConfig,
    *,
    deadline: float | None,
    device: torch.device,
) -> dict:
    """Transformer-XL training: ``batch_size`` streams read segment after segment, the memory
    carried from each segment to the next (no gradient through it), AdamW, gradient clipping 1.

    Returns:
        ``{"steps", "seconds", "losses"}``.
    """
    streams = torch.from_numpy(text_streams(ids, cfg.batch_size)).to(device)
    L = cfg.segment
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, min(100, (cfg.steps or 1000) // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    memory, pos, losses = None, 0, []
    start = time.perf_counter()
    model.train()
    step = 0
    while cfg.steps is None or step < cfg.steps:
        if deadline is not None and time.perf_counter() > deadline:
            break
        if pos + L + 1 > streams.shape[1]:  # the end of the streams: start again, no memory
            memory, pos = None, 0
        seg = streams[:, pos : pos + L + 1]
        loss, memory = model(seg[:, :-1], memory=memory, targets=seg[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        pos += L
        step += 1
    model.eval()
    return {"steps": step, "seconds": time.perf_counter() - start, "losses": losses}


def held_out_documents(ids, n_docs: int, doc_len: int) -> Tensor:
    """``(D, N + 1)`` consecutive, non-overlapping documents from the start of the held-out text.

    Raises:
        UserError: the held-out text is too short for them.
    """
    need = n_docs * (doc_len + 1)
    if len(ids) < need:
        raise UserError(
            f"the held-out text has {len(ids)} tokens, fewer than n_docs x (doc_len + 1) = "
            f"{need}: use fewer or shorter documents"
        )
    return torch.from_numpy(np.asarray(ids[np.arange(need)], dtype=np.int64)).view(n_docs, -1)


def readings(model: TransformerXL, docs: Tensor, cfg: LongContextConfig) -> dict[str, Reading]:
    """Every reading of :mod:`this experiment <attnlab.experiments.long_context>` of ``docs``."""
    L, M, N = cfg.segment, cfg.mem_len, docs.shape[1] - 1
    with evaluating(model):
        read_memory(model, docs[:, : L + 1], L)  # untimed: the first call's one-off costs
        out = {
            "disjoint": read_sliding(model, docs, L, L),
            "sliding": read_sliding(model, docs, L, cfg.stride),
            "recompute": read_sliding(model, docs, L + M, L),
            "stride-1": read_sliding(model, docs, L, 1),
            "memory": read_memory(model, docs, L),
        }
        if N <= model.config.max_seq_len:
            out["full"] = read_sliding(model, docs, N, N)
    return out


def save_run(model: TransformerXL, task, run_dir: Path, trained: dict) -> None:
    """A run directory :func:`attnlab.load` opens: ``config.json`` (kind, model, the corpus
    task, training), ``model.safetensors`` and the tokenizer."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = {
        "kind": model.kind,
        "model": model.config.to_dict(),
        "task": task.config_dict(),
        "train": {k: trained[k] for k in ("steps", "seconds")},
    }
    atomic_write_text(run_dir / "config.json", json.dumps(cfg, indent=2) + "\n")
    save_model(model, run_dir / "model.safetensors")
    task.save_artifacts(run_dir)


def describe(cfg: LongContextConfig) -> dict[str, str]:
    L, M, s = cfg.segment, cfg.mem_len, cfg.stride
    return {
        "disjoint": f"chunks of {L}, each alone",
        "sliding": f"windows of {L}, stride {s}",
        "recompute": f"windows of {M}+{L}, stride {L} (the memory's span, recomputed)",
        "stride-1": f"windows of {L}, stride 1 (recomputed per token)",
        "memory": f"segments of {L} + Transformer-XL memory {M}",
        "full": f"one segment of {cfg.doc_len} (full attention)",
    }


def run_long_context(
    cfg: LongContextConfig, out_dir: str | Path, *, overwrite: bool = False
) -> dict:
    """Train one Transformer-XL, read the held-out documents every way, write the outputs.

    Returns:
        ``{"config", "data", "train": {"steps", "seconds", "final_loss"}, "readings": {name:
        {"loss", "rows_per_token", "keys_per_token", "ms_per_1k_tokens", "by_position"}},
        "speedup": stride-1 time / memory time, "summary", "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting, too little held-out text.
    """
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    device = resolve_device(cfg.device)
    task = lm_task(cfg.data, cfg.segment, max_chars=cfg.max_chars, seed=cfg.seed)
    docs = held_out_documents(task.splits["val"], cfg.n_docs, cfg.doc_len).to(device)
    span = max(cfg.doc_len, cfg.mem_len + cfg.segment)
    model_cfg = TransformerXLConfig(
        vocab_size=task.vocab_size,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        max_seq_len=span,
        mem_len=cfg.mem_len,
    )
    if len(task.splits["train"]) // cfg.batch_size < cfg.segment + 1:
        raise UserError(
            f"the training text ({len(task.splits['train'])} tokens) cut into batch_size="
            f"{cfg.batch_size} streams leaves fewer than segment + 1 = {cfg.segment + 1} tokens "
            "each: use a smaller --batch-size or --segment, or more text"
        )
    torch.manual_seed(cfg.seed)
    model = TransformerXL(model_cfg).to(device)
    deadline = None
    if cfg.steps is None:
        deadline = time.perf_counter() + budget.share(1, reserve=cfg.reserve * cfg.max_time)
    trained = train_xl(model, task.splits["train"], cfg, deadline=deadline, device=device)
    log.info("long-context: %d training steps", trained["steps"])
    save_run(model, task, out / "runs" / "xl", trained)
    read = {k: r.summary() for k, r in readings(model, docs, cfg).items()}
    tail = trained["losses"][-max(1, len(trained["losses"]) // 10) :]
    results = {
        "config": asdict(cfg),
        "data": {
            "corpus": cfg.data,
            "vocab_size": task.vocab_size,
            "eval_tokens": docs[:, 1:].numel(),
        },
        "train": {
            "steps": trained["steps"],
            "seconds": trained["seconds"],
            "final_loss": float(np.mean(tail)) if tail else math.nan,
        },
        "readings": read,
        "speedup": read["stride-1"]["ms_per_1k_tokens"] / read["memory"]["ms_per_1k_tokens"],
    }
    results["summary"] = summarise(results)
    table = common.Table(
        [
            "reading",
            "how",
            "loss (nats/char)",
            "query rows / token",
            "keys / token",
            "ms / 1k tokens",
        ],
        formats=["", "", ".3f", ".2f", ".1f", ".1f"],
    )
    how = describe(cfg)
    for name, r in read.items():
        table.add(
            name,
            how[name],
            r["loss"],
            r["rows_per_token"],
            r["keys_per_token"],
            r["ms_per_1k_tokens"],
        )
    notes = (
        f"One Transformer-XL ({cfg.n_layers} layers, d_model {cfg.d_model}, memory "
        f"{cfg.mem_len}) trained {trained['steps']} steps on segments of L = {cfg.segment} "
        f"characters of `{cfg.data}` ({cfg.batch_size} streams, memory carried), then "
        f"{cfg.n_docs} held-out documents of {cfg.doc_len} characters read each way; every "
        "reading scores the same tokens. Rows and keys are per layer, counted; times are "
        "measured on this machine as it was (other work included)."
    )
    drawn = (plot_loss_by_position, "loss_by_position.png")
    common.write_outputs(
        out,
        "Long inputs: chunks, sliding windows, memory, full attention",
        [table],
        results,
        notes,
        plot=drawn,
        budget=budget,
    )
    return results


def summarise(results: dict) -> str:
    r = results["readings"]
    parts = [
        f"Memory {r['memory']['loss']:.3f} vs disjoint chunks {r['disjoint']['loss']:.3f} "
        f"nats/char at the same segment length",
        f"sliding windows {r['sliding']['loss']:.3f} at {r['sliding']['rows_per_token']:.1f}x "
        "the query rows",
    ]
    if "full" in r:
        parts.append(f"full attention {r['full']['loss']:.3f}")
    parts.append(
        f"reading with memory took {1 / results['speedup']:.2f}x the time of recomputing a "
        f"window per token (stride 1): {results['speedup']:.1f}x faster"
    )
    return "; ".join(parts) + "."


def plot_loss_by_position(results: dict, path: str | Path) -> None:
    """Loss at each position of the documents, one line per reading."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(9, 4.5))
    L = results["config"]["segment"]
    for name, r in results["readings"].items():
        ys = r["by_position"]
        w = 4  # neighbouring positions averaged: readable lines
        xs = [i + (w - 1) / 2 for i in range(0, len(ys), w)]
        ax.plot(
            xs,
            [float(np.mean(ys[i : i + w])) for i in range(0, len(ys), w)],
            label=f"{name} ({r['loss']:.3f})",
            linewidth=1.2,
        )
    for x in range(L, len(ys), L):
        ax.axvline(x - 0.5, color="grey", linewidth=0.5, linestyle=":")
    ax.set_xlabel(f"position in the document (dotted: segment boundaries, L = {L})")
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_title("one Transformer-XL, read six ways")
    ax.legend(fontsize=8)
    save_png(fig, path)
