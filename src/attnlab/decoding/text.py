"""Text around LM decoding: prompts, end-of-text ids, stop texts and streaming to a file.

``attnlab generate`` is these functions on parsed flags: :func:`encode_prompt`, then
:func:`beam_text` (``--beam N``) or :func:`stream_sample` (sampling, printed as tokens arrive;
byte-level BPE that ends mid-character waits for the rest of it; bytes that are not UTF-8 show as
``\\xNN`` with a note on stderr), both cut at an end-of-text id
or the ``--stop`` text (:func:`cut_at_stop_text`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from attnlab.data.detokenize import StreamDecoder
from attnlab.decoding.sampling import beam_generate, stream_generate
from attnlab.errors import UserError

__all__ = [
    "encode_prompt",
    "stop_list",
    "cut_at_stop_text",
    "beam_text",
    "say_invalid",
    "stream_sample",
]


def encode_prompt(tok, prompt: str) -> list[int]:
    """The ids of ``prompt``; an empty prompt starts from a new line (or a space, or id 0)."""
    if prompt:
        return tok.encode(prompt)
    for start in ("\n", " "):
        try:
            ids = tok.encode(start)
        except UserError:
            continue
        if ids:
            return ids
    return [0]


def stop_list(stop_ids: int | list[int] | None) -> list[int]:
    """End-of-text id(s) as a list (a checkpoint may give one id, a list or none)."""
    return [] if stop_ids is None else [stop_ids] if isinstance(stop_ids, int) else list(stop_ids)


def cut_at_stop_text(text: str, stop: str | None) -> tuple[str, bool]:
    """``(text before the first stop text, whether it was found)``."""
    if stop and stop in text:
        return text[: text.index(stop)], True
    return text, False


def beam_text(model, tok, idx, args: argparse.Namespace, stop_ids: list[int]) -> str:
    """The best beam's continuation (``--beam N``), cut at an end-of-text id or ``--stop``."""
    hyp = beam_generate(model, idx, args.n, beam=args.beam, stop=stop_ids[0] if stop_ids else None)[
        0
    ]
    new = [t for t in hyp.ids if t not in stop_ids]  # the end-of-text id ends the beam
    dec = StreamDecoder(tok)
    text = "".join(dec.push(t) for t in new) + dec.finish()
    say_invalid(dec)
    return cut_at_stop_text(text, args.stop)[0]


def say_invalid(dec: StreamDecoder) -> None:
    """A note on stderr when the model's bytes were not UTF-8 (shown as ``\\xNN``)."""
    if dec.invalid:
        print(
            f"note: the model produced {dec.invalid} byte(s) that are not valid UTF-8 text; "
            "they are shown as \\xNN",
            file=sys.stderr,
        )
    if dec.unfinished:
        print(
            f"note: generation stopped inside a multi-byte character; its first "
            f"{dec.unfinished} byte(s) are not shown",
            file=sys.stderr,
        )


def stream_sample(
    model, tok, idx, args: argparse.Namespace, stop_ids: list[int], **options: Any
) -> None:
    """Sample (or greedy with ``--temperature 0``), printing as tokens arrive.

    ``options`` go to :func:`~attnlab.decoding.stream_generate` as they are (speculative
    decoding's ``draft=``, ``speculate=``, ``prompt_lookup=``, ``stats=``).
    """
    gen = torch.Generator(device=idx.device)
    gen.manual_seed(args.seed)
    stream = not args.no_stream
    out = sys.stdout
    if stream:
        out.write(args.prompt)
        out.flush()
    dec = StreamDecoder(tok)  # holds back the bytes of an incomplete character
    shown = text = raw = ""
    stopped = False
    for nxt in stream_generate(
        model,
        idx,
        args.n,
        temperature=0.8 if args.temperature is None else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        use_cache=not args.no_cache,
        generator=gen,
        stop=stop_ids or None,
        compile=args.compile,
        **options,
    ):
        if int(nxt[0]) in stop_ids:
            break  # end of text
        raw += dec.push(int(nxt[0]))
        text, stopped = cut_at_stop_text(raw, args.stop)
        if stream and len(text) > len(shown):
            out.write(text[len(shown) :])
            out.flush()
            shown = text
        if stopped:
            break
    if not stopped:
        text = cut_at_stop_text(raw + dec.finish(), args.stop)[0]
    out.write((text[len(shown) :] if stream else args.prompt + text) + "\n")
    out.flush()
    say_invalid(dec)
