"""The flags of ``attnlab generate``, checked and turned into decoding settings.

The checks run before anything is loaded or printed, and name the flags as typed (the library
checks the values too, but only once the prompt is already on the screen):

- sampling: ``--temperature``, ``--top-k``, ``--top-p``; ``--beam N`` takes none of them, nor
  ``--no-cache``; ``--compile`` decodes over the KV cache;
- speculative decoding: ``--draft RUN`` or ``--prompt-lookup N`` (not both), ``--speculate K``,
  ``--no-adapt``, ``--draft-dtype``, ``--draft-quantize``, ``--draft-compile``.

:func:`load_draft` reads the draft run and refuses it unless its tokenizer is the model's;
:func:`speculative_settings` gives the keywords of :func:`attnlab.decoding.stream_generate`;
:func:`report_speculation` is the summary line on stderr; :func:`generate_from_flags` is the
command once the model is loaded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch

from attnlab.decoding.speculative import SpeculativeStats, check_draft, check_tokenizers
from attnlab.decoding.text import beam_text, encode_prompt, stop_list, stream_sample
from attnlab.errors import UserError
from attnlab.fast import for_decoding

__all__ = [
    "SAMPLING_FLAGS",
    "SPEED_FLAGS",
    "check_generate_flags",
    "generate_from_flags",
    "check_speculative_flags",
    "load_draft",
    "speculative_settings",
    "report_speculation",
]


# The decoding flags of ``attnlab generate``, as rows of ``attnlab.commands.flags.add_flags``
# (``(flag, kind, default, help[, keywords])``), next to what checks them.
# fmt: off
#: how tokens are chosen: sampling (temperature, top-k, top-p), beam search, stop text, seed
SAMPLING_FLAGS = [
    ("--temperature", float, None, "sampling temperature; 0 = greedy (default 0.8)"),
    ("--top-k", int, None, "sample among the k likeliest tokens"),
    ("--top-p", float, None, "nucleus sampling threshold (0, 1]"),
    ("--beam", int, None,
     "beam search with N beams instead of sampling; prints the best beam "
     "(the prompt and the new tokens must fit in the context)", {"metavar": "N"}),
    ("--stop", None, None, "stop when this text is generated"),
    ("--seed", int, 0, "random seed for sampling (default 0)"),
]
#: how fast: dtype, int8, the compiled step, speculative decoding, the cache, streaming
SPEED_FLAGS = [
    ("--dtype", ["float32", "bfloat16"], None,
     "parameter and activation dtype (default float32; bfloat16 with --quantize): "
     "bfloat16 halves the bytes read per token, about 2x faster batch-1 decoding on a "
     "CPU"),
    ("--quantize", ["int8"], None,
     "weight-only int8 linear layers (per-channel scales, output head included): a "
     "quarter of fp32's bytes; logits within about 1-4 %% of fp32's"),
    ("--compile", "store_true", None,
     "decode over a static KV cache with a torch.compile'd step (CUDA graphs on a GPU); "
     "the first run compiles for tens of seconds on a CPU, so it pays for long outputs"),
    ("--draft", None, None,
     "speculative decoding: a smaller LM run with the same tokenizer drafts tokens that "
     "the model checks several at a time (greedy output equals plain greedy decoding; "
     "sampling keeps the model's distribution exactly)", {"metavar": "DRAFT_RUN"}),
    ("--speculate", int, None,
     "the most tokens drafted per round (default 5); each round drafts 0..K, chosen "
     "from the recent acceptance rate unless --no-adapt", {"metavar": "K"}),
    ("--prompt-lookup", int, None,
     "speculative decoding without a draft model: propose the tokens that followed the "
     "latest earlier occurrence of the last n-gram (n = N..1) of the context",
     {"metavar": "N"}),
    ("--no-adapt", "store_true", None, "draft exactly K tokens every round"),
    ("--draft-dtype", ["float32", "bfloat16"], None,
     "the draft's dtype (without it and --draft-quantize: the model's "
     "--dtype/--quantize)"),
    ("--draft-quantize", ["int8"], None, "quantise the draft's linear layers to int8"),
    ("--draft-compile", argparse.BooleanOptionalAction, None,
     "compile the draft's step (or not, with --no-draft-compile) whatever --compile does "
     "for the model (default: as --compile); a small draft is bound by Python's cost per "
     "step, which compiling removes"),
    ("--no-cache", "store_true", None, "recompute the context every step"),
    ("--no-stream", "store_true", None, "print only when finished"),
]
# fmt: on


def check_generate_flags(args: argparse.Namespace) -> None:
    """Refuse ``attnlab generate`` flags that are out of range or do not go together.

    Raises:
        UserError: naming the flags.
    """
    if args.n < 0:
        raise UserError(f"-n must be >= 0, got {args.n}")
    if args.temperature is not None and not args.temperature >= 0:
        raise UserError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {args.top_k}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1] (1 = off), got {args.top_p}")
    if args.beam is not None:
        sampling = [
            flag
            for flag, value in (
                ("--temperature", args.temperature),
                ("--top-k", args.top_k),
                ("--top-p", args.top_p),
            )
            if value is not None
        ]
        if sampling:
            raise UserError(
                "--beam searches for the most probable continuation and takes no sampling "
                f"options ({', '.join(sampling)}): drop them or --beam"
            )
        if args.beam < 1:
            raise UserError(f"--beam must be >= 1, got {args.beam}")
        if args.no_cache:
            raise UserError("--beam decodes with the model's cache; drop --no-cache")
    if args.compile and args.no_cache:
        raise UserError("--compile decodes over the KV cache; drop --no-cache")
    if args.compile and args.beam is not None:
        raise UserError("--compile is for sampling and greedy decoding; drop it or --beam")
    check_speculative_flags(args)


def check_speculative_flags(args: argparse.Namespace) -> None:
    """Refuse speculative flags that do not go together (or with ``--beam``/``--no-cache``).

    Raises:
        UserError: naming the flags.
    """
    given = [f for f, v in (("--draft", args.draft), ("--prompt-lookup", args.prompt_lookup)) if v]
    if len(given) == 2:
        raise UserError("give --draft RUN or --prompt-lookup N, not both")
    if not given:
        for flag, value in (
            ("--speculate", args.speculate),
            ("--no-adapt", args.no_adapt),
            ("--draft-dtype", args.draft_dtype),
            ("--draft-quantize", args.draft_quantize),
            ("--draft-compile", args.draft_compile is not None),
        ):
            if value:
                raise UserError(f"{flag} is for speculative decoding: add --draft RUN")
        return
    if args.beam is not None:
        raise UserError(f"{given[0]} speeds up sampling and greedy decoding; drop it or --beam")
    if args.no_cache:
        raise UserError(f"{given[0]} decodes over the KV caches; drop --no-cache")
    if args.speculate is not None and args.speculate < 1:
        raise UserError(f"--speculate must be >= 1, got {args.speculate}")
    if args.prompt_lookup is not None and args.prompt_lookup < 1:
        raise UserError(f"--prompt-lookup must be >= 1, got {args.prompt_lookup}")
    if args.prompt_lookup and (
        args.draft_dtype or args.draft_quantize or args.draft_compile is not None
    ):
        raise UserError("--draft-dtype, --draft-quantize and --draft-compile are for --draft RUN")


def load_draft(args: argparse.Namespace, model, tok, load_lm: Callable[..., Any]):
    """The ``--draft`` run, read by ``load_lm`` (``attnlab generate``'s loader), refused unless
    its tokenizer is the model's."""
    device = str(next(model.parameters()).device)
    draft, draft_tok = load_lm(
        args.draft,
        args.weights,
        device,
        # the draft's own settings when given (either one), the model's otherwise
        **(
            {"dtype": args.draft_dtype, "quantize": args.draft_quantize}
            if args.draft_dtype or args.draft_quantize
            else {"dtype": args.dtype, "quantize": args.quantize}
        ),
    )
    check_tokenizers(tok, draft_tok)
    check_draft(model, draft)
    return draft


def speculative_settings(args: argparse.Namespace) -> dict:
    """The speculative keywords of :func:`attnlab.decoding.stream_generate` (``{}`` without
    ``--draft`` or ``--prompt-lookup``), with a fresh stats record under ``"stats"``."""
    if args.draft_model is None and args.prompt_lookup is None:
        return {}
    return {
        "draft": args.draft_model,
        "prompt_lookup": args.prompt_lookup,
        "speculate": 5 if args.speculate is None else args.speculate,
        "adapt": not args.no_adapt,
        "draft_compile": args.draft_compile,  # None (as --compile) with --prompt-lookup
        "stats": SpeculativeStats(),
    }


def report_speculation(st: SpeculativeStats) -> None:
    """One line on stderr: tokens per forward of the model and the acceptance rate."""
    sys.stderr.write(
        f"speculative decoding: {st.tokens} tokens in {st.rounds} forwards of the model "
        f"({st.tokens_per_round:.2f} per forward), {st.accepted}/{st.drafted} drafted "
        f"tokens accepted ({100 * st.acceptance_rate:.0f} %)\n"
    )


def generate_from_flags(model, tok, args: argparse.Namespace, stop_ids, load_lm) -> None:
    """``attnlab generate`` once the model is loaded: the prompt checked against the context,
    the fast paths applied on request, then beam search or (speculative) sampling, printed.

    Args:
        model, tok: the LM and its tokenizer (``--dtype``/``--quantize`` already applied).
        args: the parsed flags, checked by :func:`check_generate_flags`.
        stop_ids: end-of-text id(s) of the checkpoint (an int, a list or None).
        load_lm: the run loader, for ``--draft RUN``.

    Raises:
        UserError: a prompt longer than the model's context.
    """
    ids = encode_prompt(tok, args.prompt)
    ctx = model.config.max_seq_len
    if len(ids) > ctx:
        raise UserError(
            f"the prompt is {len(ids)} tokens long but the model's context is {ctx} "
            "tokens; shorten the prompt"
        )
    idx = torch.tensor([ids], device=next(model.parameters()).device)
    if args.dtype or args.quantize or args.compile:  # the fast paths, on request only
        model = for_decoding(model)  # (the dtype and int8 were applied by the loader)
    args.draft_model = load_draft(args, model, tok, load_lm) if args.draft else None
    stops = stop_list(stop_ids)
    if args.beam is not None:
        sys.stdout.write(args.prompt + beam_text(model, tok, idx, args, stops) + "\n")
        sys.stdout.flush()
        return
    spec = speculative_settings(args)  # {} unless --draft or --prompt-lookup
    stream_sample(model, tok, idx, args, stops, **spec)
    if spec:
        report_speculation(spec["stats"])
