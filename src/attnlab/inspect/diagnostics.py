"""Per-head diagnostics: what each attention head does, scored from its attention pattern.

For a pattern ``p (B, H, T, S)`` (row t: how query t spreads over the keys):

- causal leak: the largest weight mass a query puts on later keys, Σ_{j>t} p[t, j] (0 for a
  working causal mask; checked only where the model is causal);
- entropy: mean over queries of −Σ_j p[t, j] log p[t, j] (nats), and uniformity, the same
  divided by log(number of keys the query may see): 1 for a uniform head;
- previous-token score: mean over t ≥ 1 of p[t, t−1]; first-token ("sink") score: mean over
  t ≥ 1 of p[t, 0]; diagonal score: mean over t of p[t, t];
- on ``[r, r]`` (random tokens r of length n, repeated): duplicate-token score, mean over the
  second copy of p[t, t−n] (the same token earlier), and induction (prefix-matching) score,
  mean of p[t, t−n+1] (the token that followed it);
- loss change when the head is zero-ablated (given a loss), and for translation the agreement of
  cross-attention with a known word alignment (mean mass on the aligned source tokens).

A head is flagged degenerate when it is uniform, stuck on the diagonal or on the first token, or
(in a causal stack) sees the future; :func:`flag_head` gives the reasons.

Shape legend: B batch, H heads, T queries, S keys, n repeated length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.attention.additive import AdditiveAttention
from attnlab.inspect.ablation import ablate_heads
from attnlab.inspect.families import find_stacks
from attnlab.inspect.hooks import hooks, run_model, run_with_cache
from attnlab.layers.hook import hook_name
from attnlab.layers.modes import evaluating

__all__ = [
    "HeadScores",
    "alignment_agreement",
    "diagnose",
    "flag_head",
    "pattern_scores",
    "repeated_scores",
    "repeated_tokens",
    "summary_table",
]

# thresholds of the degenerate-head flags
UNIFORM, DIAGONAL, SINK, LEAK = 0.95, 0.9, 0.9, 1e-4


def _allowed(T: int, S: int, causal: bool, device) -> Tensor:
    if not causal:
        return torch.ones(T, S, dtype=torch.bool, device=device)
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)  # bottom-right aligned


def pattern_scores(
    pattern: Tensor, *, causal: bool = False, key_mask: Tensor | None = None
) -> dict[str, Tensor]:
    """Scores of each head from its pattern ``(B, H, T, S)``.

    Args:
        causal: the stack is causal: count the keys a query may see as ``t + 1`` and report the
            leak onto later keys.
        key_mask: ``(B, S)`` True for real keys (padding is not counted as a key).

    Returns:
        ``{score: (H,)}`` with ``entropy``, ``uniformity``, ``first_token`` and, when T == S,
        ``previous_token`` and ``diagonal``; with ``causal``, ``causal_leak``.
    """
    p = pattern.float()
    B, H, T, S = p.shape
    allowed = _allowed(T, S, causal, p.device)[None, None]  # (1, 1, T, S)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :].to(p.device)
    n_keys = allowed.sum(-1).float()  # (B or 1, 1, T)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)  # (B, H, T)
    rows = (n_keys >= 2).expand(B, H, T)
    uniform = ent / n_keys.clamp_min(2).log()
    out = {
        "entropy": ent.mean(dim=(0, 2)),
        "uniformity": _masked_mean(uniform, rows),
        "first_token": p[:, :, 1:, 0].mean(dim=(0, 2)) if T > 1 else p[:, :, :, 0].mean((0, 2)),
    }
    if T == S:
        out["diagonal"] = p.diagonal(dim1=-2, dim2=-1).mean(dim=(0, 2))
        if T > 1:
            out["previous_token"] = p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))
    if causal:
        future = ~_allowed(T, S, True, p.device)
        out["causal_leak"] = (p * future).sum(-1).amax(dim=(0, 2))
    return out


def _masked_mean(x: Tensor, rows: Tensor) -> Tensor:
    w = rows.float()
    return (x * w).sum(dim=(0, 2)) / w.sum(dim=(0, 2)).clamp_min(1)


def repeated_tokens(vocab_size: int, n: int, batch: int = 4, *, seed: int = 0) -> Tensor:
    """``(batch, 2n)`` random tokens, each row a random sequence of length n twice."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, vocab_size, (batch, n), generator=g)
    return torch.cat([r, r], dim=1)


def repeated_scores(pattern: Tensor, n: int) -> dict[str, Tensor]:
    """Duplicate-token and induction scores ``(H,)`` from a pattern ``(B, H, 2n, 2n)`` on
    repeated tokens: the mean over the second copy of p[t, t−n] and of p[t, t−n+1]."""
    p = pattern.float()
    dup = p.diagonal(offset=-n, dim1=-2, dim2=-1)  # (B, H, n): p[t, t-n] for t = n … 2n-1
    ind = p.diagonal(offset=-(n - 1), dim1=-2, dim2=-1)[..., 1:]  # p[t, t-n+1], t = n … 2n-1
    return {"duplicate_token": dup.mean(dim=(0, 2)), "induction": ind.mean(dim=(0, 2))}


def alignment_agreement(pattern: Tensor, alignment: Tensor) -> Tensor:
    """Mean attention mass on the aligned source tokens, per head ``(H,)``.

    Args:
        pattern: cross-attention ``(B, H, T, S)``.
        alignment: ``(B, T, S)`` bool, True where target token t is aligned to source token s;
            target tokens aligned to nothing are left out.
    """
    a = alignment.to(pattern.device)
    mass = (pattern.float() * a[:, None]).sum(-1)  # (B, H, T)
    rows = a.any(-1)[:, None].expand_as(mass)  # (B, H, T)
    return _masked_mean(mass, rows)


@dataclass
class HeadScores:
    """The diagnostics of one head (None: not measured for this head)."""

    stack: str
    layer: int
    head: int
    attention: str  # "self", "cross" or "additive" (Bahdanau)
    causal: bool
    entropy: float
    uniformity: float
    first_token: float
    previous_token: float | None = None
    diagonal: float | None = None
    causal_leak: float | None = None
    duplicate_token: float | None = None
    induction: float | None = None
    loss_delta: float | None = None
    alignment: float | None = None
    flags: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        if self.attention == "additive":  # Bahdanau: one head, no stack of blocks
            return f"{self.stack}.head{self.head}"
        attn = "attn" if self.attention == "self" else "cross_attn"
        return f"{self.stack}.{self.layer}.{attn}.head{self.head}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


def flag_head(s: HeadScores) -> list[str]:
    """Why a head looks degenerate (empty when it does not)."""
    flags = []
    if s.causal and s.causal_leak is not None and s.causal_leak > LEAK:
        flags.append(f"causal leak: {s.causal_leak:.3g} of a row's weight on later tokens")
    if s.uniformity > UNIFORM:
        flags.append(f"uniform: entropy {s.uniformity:.2f} of the maximum")
    if s.diagonal is not None and s.diagonal > DIAGONAL:
        flags.append(f"diagonal: {s.diagonal:.2f} of the weight on the token itself")
    if s.first_token > SINK and s.layer > 0:
        flags.append(f"sink: {s.first_token:.2f} of the weight on the first token")
    return flags


def _key_mask(inputs: Any, model: nn.Module, stack: str) -> Tensor | None:
    """The real-key mask of a translation encoder/cross-attention (the source mask)."""
    if isinstance(inputs, tuple) and len(inputs) >= 2 and inputs[1].dtype == torch.bool:
        return inputs[1] if stack in ("encoder", "cross") else None
    return None


def diagnose(
    model: nn.Module,
    inputs: Any,
    *,
    repeated: Tensor | None = None,
    loss_fn: Callable[[Any], Tensor] | None = None,
    alignment: Tensor | None = None,
) -> list[HeadScores]:
    """Diagnostics of every attention head of ``model``.

    Args:
        inputs: a batch the model's forward takes (a tensor or a tuple of its arguments); the
            pattern scores are measured on it.
        repeated: ``(B, 2n)`` repeated random tokens (:func:`repeated_tokens`) for the
            duplicate-token and induction scores (token models only).
        loss_fn: ``loss_fn(output)`` on ``inputs``: each head's ``loss_delta`` is the loss with
            the head zero-ablated minus the loss without.
        alignment: ``(B, T, S)`` known word alignment of ``inputs`` (translation): each
            cross-attention head's agreement with it.

    Returns:
        One :class:`HeadScores` per head, stack by stack, layer by layer, with ``flags`` set.
    """
    stacks = find_stacks(model)
    device = next((p.device for p in model.parameters()), None)
    if repeated is not None and device is not None:
        repeated = repeated.to(device)
    with evaluating(model), torch.no_grad():
        _, cache = run_with_cache(model, inputs, names=lambda n: n.endswith(".hook_pattern"))
        rep_cache = None
        if repeated is not None:
            _, rep_cache = run_with_cache(
                model, repeated, names=lambda n: n.endswith("attn.hook_pattern")
            )
        base = float(loss_fn(run_model(model, inputs))) if loss_fn is not None else None
        results: list[HeadScores] = []
        for s in stacks.values():
            for layer, block in enumerate(s.blocks):
                kinds = [("self", "attn")] + ([("cross", "cross_attn")] if s.cross else [])
                for kind, attn in kinds:
                    name = f"{block}.{attn}.hook_pattern"
                    if name not in cache:
                        continue
                    causal = s.causal and kind == "self"
                    km = _key_mask(inputs, model, "cross" if kind == "cross" else s.name)
                    pat = cache.calls(name)
                    pat = pat[0] if len(pat) == 1 else torch.cat(pat, 0)  # Swin: windows
                    if km is not None and km.shape[0] != pat.shape[0]:
                        km = None
                    scores = pattern_scores(pat, causal=causal, key_mask=km)
                    if rep_cache is not None and kind == "self" and name in rep_cache:
                        n = repeated.shape[1] // 2
                        scores.update(repeated_scores(rep_cache[name], n))
                    if alignment is not None and kind == "cross":
                        scores["alignment"] = alignment_agreement(pat, alignment)
                    for h in range(pat.shape[1]):
                        hs = HeadScores(
                            s.name,
                            layer,
                            h,
                            kind,
                            causal,
                            **{k: float(v[h]) for k, v in scores.items()},
                        )
                        if loss_fn is not None:
                            with ablate_heads(model, {f"{block}.{attn}": [h]}):
                                loss = float(loss_fn(run_model(model, inputs)))
                            hs.loss_delta = loss - base
                        hs.flags = flag_head(hs)
                        results.append(hs)
        results += _additive_heads(model, cache, inputs, alignment, loss_fn, base)
    return results


def _additive_heads(
    model: nn.Module,
    cache: Any,
    inputs: Any,
    alignment: Tensor | None,
    loss_fn: Callable[[Any], Tensor] | None,
    base: float | None,
) -> list[HeadScores]:
    """Bahdanau attention (one head, called once per decoder step): its steps' weights
    ``(B, 1, S)`` stacked into one ``(B, 1, T, S)`` pattern; ablating it zeroes its context."""
    out = []
    for path, module in model.named_modules():
        if not isinstance(module, AdditiveAttention):
            continue
        name = f"{hook_name(path)}.hook_pattern"
        if name not in cache:
            continue
        pat = cache.stacked(name, dim=1)[:, None]  # (B, 1, T, S)
        km = _key_mask(inputs, model, "cross")
        scores = pattern_scores(pat, key_mask=km)
        if alignment is not None:
            scores["alignment"] = alignment_agreement(pat, alignment)
        hs = HeadScores(
            hook_name(path), 0, 0, "additive", False, **{k: float(v[0]) for k, v in scores.items()}
        )
        if loss_fn is not None:
            zero = [(f"{hook_name(path)}.hook_context", lambda a, n: torch.zeros_like(a))]
            with hooks(model, zero):
                hs.loss_delta = float(loss_fn(run_model(model, inputs))) - base
        hs.flags = flag_head(hs)
        out.append(hs)
    return out


def summary_table(scores: list[HeadScores]) -> str:
    """A fixed-width table of the scores, one head per line, flags last."""
    cols = [
        ("head", lambda s: s.name, 28),
        ("entropy", lambda s: s.entropy, 8),
        ("uniform", lambda s: s.uniformity, 8),
        ("prev", lambda s: s.previous_token, 6),
        ("first", lambda s: s.first_token, 6),
        ("diag", lambda s: s.diagonal, 6),
        ("dup", lambda s: s.duplicate_token, 6),
        ("induct", lambda s: s.induction, 6),
        ("leak", lambda s: s.causal_leak, 7),
        ("Δloss", lambda s: s.loss_delta, 7),
        ("align", lambda s: s.alignment, 6),
    ]

    def cell(v: Any, w: int) -> str:
        if v is None:
            return "-".rjust(w)
        if isinstance(v, float):
            return (f"{v:.2g}" if 0 < abs(v) < 0.01 else f"{v:.2f}").rjust(w)
        return str(v).ljust(w)

    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, _, w) in enumerate(cols))]
    for s in scores:
        row = "  ".join(cell(get(s), w) for _, get, w in cols)
        lines.append(row + ("  " + "; ".join(s.flags) if s.flags else ""))
    return "\n".join(lines)
