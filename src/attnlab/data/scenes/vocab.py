"""The word vocabulary shared by captions and questions, and the closed answer list.

``<pad>`` 0, ``<unk>`` 1, ``<start>`` 2, ``<end>`` 3, then the words. Out-of-vocabulary question
words map to ``<unk>`` and are reported. A run directory stores it as ``vocab.json``; it is what
:func:`attnlab.runs.load` returns as the tokenizer of captioning and VQA runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from attnlab.data.scenes.captions import plural
from attnlab.data.scenes.questions import answer_list
from attnlab.data.scenes.world import COLOURS, NUMBER_WORDS, SHAPES
from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text

__all__ = ["tokenize", "Vocab", "build_vocab"]


# Words (any alphabet, so "café" is one unknown word, not "caf" + "é"), numbers, punctuation marks.
_TOKEN_RE = re.compile(r"[^\W\d_]+|\d+|[^\w\s]")
_ALIASES = {
    "color": "colour",
    "colors": "colours",
    "leftmost": "left",
    "nearest": "closest",
    "furthest": "farthest",
}


def tokenize(text: str) -> list[str]:
    """Lower-case words and punctuation marks: "What colour?" -> ["what", "colour", "?"]."""
    return [_ALIASES.get(t, t) for t in _TOKEN_RE.findall(text.lower())]


class Vocab:
    """Word vocabulary shared by captions and questions, with the special tokens.

    ``<pad>`` 0, ``<unk>`` 1, ``<start>`` 2, ``<end>`` 3, then the words. ``<end>`` ends a
    caption; the full stop ``"."`` is an ordinary word (a caption may hold two sentences).
    """

    PAD, UNK, START, END = 0, 1, 2, 3
    SPECIALS = ("<pad>", "<unk>", "<start>", "<end>")

    def __init__(self, words: list[str], answers: list[str]) -> None:
        self.itos = list(self.SPECIALS) + [w for w in words if w not in self.SPECIALS]
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.answers = list(answers)
        self.answer_index = {a: i for i, a in enumerate(self.answers)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        """Token ids of ``text`` and the words that were not in the vocabulary (mapped to <unk>)."""
        ids, unknown = [], []
        for w in tokenize(text):
            if w in self.stoi:
                ids.append(self.stoi[w])
            else:
                ids.append(self.UNK)
                unknown.append(w)
        return ids, unknown

    def encode_caption(self, text: str) -> list[int]:
        """``<start> words <end>``; a caption word outside the vocabulary is a bug, not input."""
        ids, unknown = self.encode(text)
        if unknown:
            raise ValueError(f"caption {text!r} has words outside the vocabulary: {unknown}")
        return [self.START] + ids + [self.END]

    def decode(self, ids) -> str:
        """Words of ``ids`` up to (not including) ``<end>``, skipping ``<start>``/``<pad>``."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.END:
                break
            if i in (self.PAD, self.START):
                continue
            out.append(self.itos[i] if 0 <= i < len(self.itos) else "<unk>")
        return " ".join(out)

    def to_dict(self) -> dict:
        return {"words": self.itos, "answers": self.answers}

    @classmethod
    def from_dict(cls, d: dict) -> Vocab:
        return cls(list(d["words"]), list(d["answers"]))

    def save(self, path: str | Path) -> None:
        """Write the vocabulary as JSON (atomically)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        """Read a vocabulary written by :meth:`save`.

        Raises:
            UserError: a missing or corrupted file.
        """
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            raise UserError(f"no vocabulary file {path}") from None
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UserError(f"vocabulary file {path} is corrupted: {err}") from None


def build_vocab() -> Vocab:
    """The closed vocabulary of every caption and question the generator can produce."""
    words: list[str] = []
    templates = [
        "a an , and . left right of above below the is on or at top bottom",
        "what colour shape object objects closest farthest to from how many are there ?",
    ]
    for t in templates:
        words += t.split()
    words += list(COLOURS) + list(SHAPES) + [plural(s) for s in SHAPES] + list(NUMBER_WORDS)
    words += ["yes", "no"]
    return Vocab(list(dict.fromkeys(words)), answer_list())
