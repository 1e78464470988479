"""The speculative-decoding flags of ``attnlab generate``: ``--draft RUN``, ``--speculate K``,
``--prompt-lookup N``, ``--no-adapt``, ``--draft-dtype``, ``--draft-quantize`` (checked, the draft
loaded and refused unless its tokenizer is the model's, the settings for
:func:`attnlab.decoding.stream_generate`, the summary line on stderr)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from attnlab.errors import UserError

__all__ = ["check_speculative_flags", "load_draft", "speculative_settings", "report_speculation"]


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
    if args.prompt_lookup and (args.draft_dtype or args.draft_quantize):
        raise UserError("--draft-dtype and --draft-quantize are for --draft RUN")


def load_draft(args: argparse.Namespace, model, tok, load_lm: Callable[..., Any]):
    """The ``--draft`` run, read by ``load_lm`` (``attnlab generate``'s loader), refused unless
    its tokenizer is the model's."""
    from attnlab.decoding.speculative import check_draft, check_tokenizers

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
    from attnlab.decoding.speculative import SpeculativeStats

    return {
        "draft": args.draft_model,
        "prompt_lookup": args.prompt_lookup,
        "speculate": 5 if args.speculate is None else args.speculate,
        "adapt": not args.no_adapt,
        "stats": SpeculativeStats(),
    }


def report_speculation(st) -> None:
    """One line on stderr: tokens per forward of the model and the acceptance rate."""
    sys.stderr.write(
        f"speculative decoding: {st.tokens} tokens in {st.rounds} forwards of the model "
        f"({st.tokens_per_round:.2f} per forward), {st.accepted}/{st.drafted} drafted "
        f"tokens accepted ({100 * st.acceptance_rate:.0f} %)\n"
    )
