"""Autoregressive sampling from language models: greedy, temperature, top-k, top-p, beam.

At each step the model gives logits for the next token; we pick one and feed it back:

    greedy       argmax_v logits_v                               (temperature = 0)
    temperature  sample from softmax(logits / τ)
    top-k        keep the k largest logits, renormalise
    top-p        keep the smallest set of tokens whose probability sums to ≥ p (nucleus)

With the KV cache (the default, through the model's ``start_decoding`` / ``decode_step``) the
prompt is encoded once and every later step feeds only the new token, reusing the keys/values of
earlier positions: O(S) per token instead of O(S²). Models without that interface (the bigram
table) recompute the window at every step.
Prompts of different lengths go in one batch left-padded with ``attention_mask`` (True = real
token); a padded prompt yields the same tokens as the prompt alone. Once the context
(``max_seq_len``) is full, the oldest tokens are dropped and the window is encoded again.
``compile=True`` decodes over static caches with a compiled step (:mod:`attnlab.fast.compiled`).

Shape legend: B batch, T prompt length, V vocab.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.decoding.interface import supports_decoding
from attnlab.decoding.probs import next_token_probs
from attnlab.decoding.search import Hypothesis, beam_search
from attnlab.decoding.speculative import speculative_stream
from attnlab.errors import UserError
from attnlab.fast.compiled import capacity_bucket, start_static
from attnlab.layers import evaluating

__all__ = [
    "generate",
    "stream_generate",
    "sample_next",
    "next_token_probs",
    "left_pad",
    "beam_generate",
]


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick the next token ``(B,)`` from ``logits (B, V)``.

    Args:
        temperature: 0 = greedy (argmax); otherwise logits are divided by it before sampling.
        top_k: sample among the ``top_k`` most likely tokens only.
        top_p: sample from the smallest set whose probabilities sum to at least ``top_p``.
        generator: torch generator for reproducible sampling.
    """
    if temperature == 0:
        # the same index (bf16/fp16 -> fp32 is exact), and a CPU's fp32 argmax is twice as fast
        return logits.float().argmax(dim=-1)
    probs = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Batch token lists of different lengths: ``(idx (B, T), attention_mask (B, T))``."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("every prompt needs at least one token")
    T = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for b, p in enumerate(prompts):
        idx[b, T - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        mask[b, T - len(p) :] = True
    return idx, mask


def _check(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    attention_mask: Tensor | None,
) -> int:
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise UserError(f"idx must be a non-empty (B, T) batch of ids, got {tuple(idx.shape)}")
    if max_new_tokens < 0:
        raise UserError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise UserError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise UserError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise UserError(f"top_p must be in (0, 1], got {top_p}")
    if attention_mask is not None and attention_mask.shape != idx.shape:
        raise UserError(
            f"attention_mask {tuple(attention_mask.shape)} must match idx {tuple(idx.shape)}"
        )
    ctx = model.config.max_seq_len
    if idx.shape[1] > ctx:
        raise UserError(
            f"the prompt has {idx.shape[1]} tokens but the model's context is "
            f"{ctx} (max_seq_len); shorten the prompt"
        )
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and idx.numel() and (int(idx.max()) >= vocab or int(idx.min()) < 0):
        raise UserError(
            f"token ids must be in [0, {vocab}), got {int(idx.min())}..{int(idx.max())}"
        )
    return ctx


@torch.no_grad()
def stream_generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: int | Sequence[int] | None = None,
    attention_mask: Tensor | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    compile: bool = False,
    draft: nn.Module | None = None,
    draft_compile: bool | None = None,
    speculate: int = 5,
    adapt: bool = True,
    prompt_lookup: int | None = None,
    stats: Any = None,
) -> Iterator[Tensor]:
    """Yield the next token of every row, ``(B,)``, one step at a time (see :func:`generate`)."""
    ctx = _check(model, idx, max_new_tokens, temperature, top_k, top_p, attention_mask)
    if compile and not use_cache:
        raise UserError("compiled decoding runs over the KV cache: drop use_cache=False")
    device = next(model.parameters()).device
    stop_list = [] if stop is None else [stop] if isinstance(stop, int) else list(stop)
    if draft is not None or prompt_lookup is not None:
        if not use_cache:
            raise UserError("speculative decoding runs over the KV caches: drop use_cache=False")

        rows = idx.tolist() if attention_mask is None else [
            [t for t, real in zip(r, m) if real]
            for r, m in zip(idx.tolist(), attention_mask.bool().tolist())
        ]  # fmt: skip
        yield from speculative_stream(
            model,
            rows,
            max_new_tokens,
            draft=draft,
            speculate=speculate,
            adapt=adapt,
            prompt_lookup=prompt_lookup,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            stop_ids=stop_list,
            generator=generator,
            compile=compile,
            draft_compile=draft_compile,
            stats=stats,
        )
        return
    stop_ids = torch.as_tensor(stop_list, dtype=torch.long, device=device)
    tokens = idx.to(device)
    mask = (
        torch.ones_like(tokens, dtype=torch.bool)
        if attention_mask is None
        else attention_mask.to(device=device, dtype=torch.bool)
    )
    has_padding = not bool(mask.all())
    use_cache = use_cache and supports_decoding(model)
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        fwd_kwargs = {"logits_to_keep": 1}  # only the last position's logits are needed
    else:
        fwd_kwargs = {}
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=device)
    start = 0  # first column of the context window
    state, cached = None, 0  # the decoding state holds columns [start, cached)
    with evaluating(model):  # restored when the generator finishes or is closed
        for step in range(max_new_tokens):
            L = tokens.shape[1]
            if L - start > ctx:  # context full: slide the window, re-encode it
                start = L - (ctx - ctx // 4 if use_cache else ctx)
                state = None
            if use_cache:
                if state is None:
                    # room for this window plus the tokens still to come, never the whole
                    # max_seq_len (imported Llama checkpoints have 32k-131k positions)
                    capacity = min(ctx, L - start + max_new_tokens - step)
                    if compile:
                        capacity = capacity_bucket(capacity, ctx)
                        state = start_static(model, tokens.shape[0], capacity, compile=True)
                    else:
                        state = model.start_decoding(tokens.shape[0], capacity)
                    cached = start
                new_mask = mask[:, cached:] if has_padding else None
                logits, state = model.decode_step(
                    tokens[:, cached:], state, attention_mask=new_mask
                )  # (B, V)
                cached = L
            else:
                kwargs = dict(fwd_kwargs)
                if has_padding:
                    kwargs["attention_mask"] = mask[:, start:]
                out = model(tokens[:, start:], **kwargs)
                if isinstance(out, tuple):  # (logits, memory) of a Transformer-XL: no memory
                    out = out[0]
                logits = out[:, -1]  # (B, V)
            nxt = sample_next(
                logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
            )
            if stop_ids.numel():
                nxt = torch.where(finished, stop_ids[0], nxt)  # finished rows repeat the stop id
                finished |= torch.isin(nxt, stop_ids)
            yield nxt
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt[:, None], dtype=torch.bool)], dim=1)
            if stop_ids.numel() and bool(finished.all()):
                return


def generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    callback: Callable[[Tensor], None] | None = None,
    **settings: Any,
) -> Tensor:
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Args:
        model: a language model with ``config.max_seq_len`` (a :class:`attnlab.DecoderLM`;
            models without ``start_decoding`` / ``decode_step`` are run without a cache).
        idx: prompts ``(B, T)``, left-padded when their lengths differ.
        max_new_tokens: tokens to add.
        temperature: 0 = greedy; >0 samples from softmax(logits / temperature).
        top_k: restrict sampling to the k most likely tokens.
        top_p: nucleus sampling threshold.
        stop: token id(s) that end a row; generation ends when every row has stopped, and rows
            that stopped earlier are filled with the (first) stop id.
        attention_mask: ``(B, T)`` bool, True = real token (left padding).
        use_cache: use a KV cache (default); False recomputes the whole window every step.
        generator: torch generator for reproducible sampling.
        callback: called with each step's new tokens ``(B,)`` (streaming).
        compile: decode over static KV caches with a ``torch.compile``d step (CUDA graphs on a
            GPU); the first call compiles (tens of seconds on a CPU, cached on disk after), so it
            pays for long generations. A :class:`attnlab.DecoderLM` only.
        draft: a smaller :class:`attnlab.DecoderLM` with the same tokenizer: speculative
            decoding (:mod:`attnlab.decoding.speculative`): the draft proposes up to
            ``speculate`` tokens, the model checks them in one forward; greedy output equals
            plain greedy decoding, sampled output has exactly the model's distribution.
        draft_compile: the draft's single-token step compiled (True) or eager (False) apart
            from the model's ``compile`` (None: as ``compile``). A small draft is bound by
            Python's cost per step, which compiling removes; the model's eager step may be
            the faster of its own two.
        speculate: K, the most tokens drafted per round (default 5).
        adapt: choose each round's number of drafts (0 … K) from the recent acceptance rate;
            False drafts K every round.
        prompt_lookup: N: draft by copying what followed the latest earlier occurrence of the
            context's last n-gram (n = N … 1) instead of running a draft model.
        stats: a :class:`attnlab.decoding.speculative.SpeculativeStats` to fill in (acceptance
            rate, tokens per round) when speculating.

    Returns:
        ``(B, T + n)`` token ids: the prompts (as given, padding included) and the new tokens.

    Raises:
        UserError: a prompt longer than the context, bad sampling settings, ids outside the vocab.
    """
    inspect.signature(generate).bind(model, idx, max_new_tokens, **settings)  # misspelt: TypeError
    out = [idx]
    for nxt in stream_generate(model, idx, max_new_tokens, **settings):
        if callback is not None:
            callback(nxt)
        out.append(nxt[:, None].to(idx.device))
    return torch.cat(out, dim=1)


# generate's settings are stream_generate's (plus the callback): show them in help() and IDEs
_CALLBACK = inspect.signature(generate).parameters["callback"]
generate.__signature__ = inspect.signature(stream_generate).replace(
    parameters=[*inspect.signature(stream_generate).parameters.values(), _CALLBACK],
    return_annotation=Tensor,
)


@torch.no_grad()
def beam_generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    beam: int = 4,
    alpha: float = 0.6,
    stop: int | None = None,
    attention_mask: Tensor | None = None,
) -> list[Hypothesis]:
    """Beam search continuation of each prompt (the most probable continuation, not a sample).

    Args:
        model: an LM with the incremental-decoding interface (:class:`attnlab.DecoderLM`).
        idx: prompts ``(B, T)``, left-padded with ``attention_mask`` when their lengths differ.
        max_new_tokens: tokens to add (fewer when ``stop`` ends a beam).
        beam: width K.
        alpha: GNMT length-penalty exponent (matters only when ``stop`` ends beams early).
        stop: end-of-text id that finishes a beam.

    Returns:
        One :class:`~attnlab.decoding.search.Hypothesis` per prompt (new tokens only).

    Raises:
        UserError: a model without the interface, a prompt longer than the context, bad sizes.
    """
    ctx = _check(model, idx, max_new_tokens, 0.0, None, None, attention_mask)
    if not supports_decoding(model):
        raise UserError(f"beam search needs a KV-cache model; {type(model).__name__} has none")
    if beam < 1:
        raise UserError(f"beam width must be at least 1, got {beam}")
    if max_new_tokens < 1:
        return [Hypothesis([], 0.0, 0.0) for _ in range(idx.shape[0])]
    if idx.shape[1] + max_new_tokens > ctx:
        raise UserError(
            f"beam search keeps the whole output in the context: the prompt ({idx.shape[1]}) "
            f"plus {max_new_tokens} new tokens exceed max_seq_len={ctx}"
        )
    device = next(model.parameters()).device
    with evaluating(model):
        state = model.start_decoding(idx.shape[0], idx.shape[1] + max_new_tokens)
        mask = None if attention_mask is None else {"attention_mask": attention_mask.to(device)}
        return beam_search(
            model,
            state,
            idx.to(device),
            beam=beam,
            max_len=max_new_tokens,
            end_id=stop,
            pad_id=0 if stop is None else stop,
            alpha=alpha,
            first_kwargs=mask,
        )
