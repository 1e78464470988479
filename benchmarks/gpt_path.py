"""Which of attnlab's files a reader follows through the GPT: the ``gpt2-mini`` preset's config,
build and one forward pass, traced with :func:`sys.settrace`.

    python benchmarks/gpt_path.py            # the files, their lines, and the totals

A file counts when any of its functions runs during ``ModelConfig.preset("gpt2-mini")``,
``DecoderLM(config)`` or ``model(ids)``; its lines are the whole file's (what a reader opens).
The modules are imported before tracing starts, so import-time code does not count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import attnlab
from attnlab.config.lm import ModelConfig
from attnlab.models.lm import DecoderLM

__all__ = ["gpt_path", "main"]

ROOT = Path(attnlab.__file__).resolve().parent


def gpt_path(preset: str = "gpt2-mini") -> dict[str, int]:
    """``{path relative to the package's parent: lines}`` of every attnlab file whose code runs
    while ``preset`` is configured, built and run forward on one ``(1, 8)`` batch."""
    seen: set[str] = set()

    def tracer(frame, event, arg):
        seen.add(frame.f_code.co_filename)
        return None  # calls are enough: no line events

    torch.manual_seed(0)
    sys.settrace(tracer)
    try:
        config = ModelConfig.preset(preset)
        model = DecoderLM(config)
        with torch.no_grad():
            model(torch.zeros(1, 8, dtype=torch.long))
    finally:
        sys.settrace(None)
    files = {}
    for name in seen:
        path = Path(name).resolve()
        if path.is_relative_to(ROOT):
            rel = path.relative_to(ROOT.parent).as_posix()
            files[rel] = len(path.read_text(encoding="utf-8").splitlines())
    return dict(sorted(files.items()))


def main() -> None:
    files = gpt_path()
    for rel, n in files.items():
        print(f"{n:6d}  {rel}")
    print(f"{sum(files.values()):6d}  lines in {len(files)} files")


if __name__ == "__main__":
    main()
