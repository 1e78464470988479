"""Tokens of the translation data: the normaliser, word/char/BPE vocabularies, the run's vocabs.

Every vocabulary starts with the four specials ``<pad>`` (0), ``<start>`` (1), ``<end>`` (2),
``<unk>`` (3). :class:`TranslationVocabs` (source and target vocabularies with the normaliser) is
what a translation run directory holds in ``vocab.json``: the "tokenizer" of a run.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from attnlab.config.translation import VOCAB_LEVELS, TranslationTaskConfig
from attnlab.errors import UserError, did_you_mean
from attnlab.fileio import atomic_write_text

__all__ = [
    "UnknownTokens",
    "PAD",
    "START",
    "END",
    "UNK",
    "SPECIALS",
    "PAD_ID",
    "START_ID",
    "END_ID",
    "UNK_ID",
    "LEVELS",
    "Normalizer",
    "normalizer_for",
    "Vocab",
    "split_tokens",
    "TranslationVocabs",
    "load_vocabs",
    "VOCAB_FILE",
]

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
LEVELS = VOCAB_LEVELS
VOCAB_FILE = "vocab.json"

# ----------------------------------------------------------------------------------------------
# normalisation


@dataclass
class Normalizer:
    """Unicode NFKC, optional lower-casing, hyphens/commas as spaces, collapsed whitespace.

    Args:
        lowercase: lower-case everything.
        strip_hyphens: turn "twenty-one" into "twenty one" and drop thousands commas (numbers).
    """

    lowercase: bool = True
    strip_hyphens: bool = False

    def __call__(self, text: str) -> str:
        text = unicodedata.normalize("NFKC", text)
        if self.lowercase:
            text = text.lower()
        if self.strip_hyphens:
            text = text.replace("-", " ").replace(",", " ")
        return " ".join(text.split())


def normalizer_for(config: TranslationTaskConfig) -> Normalizer:
    """The normaliser of a task config: hyphens and commas become spaces for the numbers task."""
    return Normalizer(lowercase=config.lowercase, strip_hyphens=config.strip_hyphens)


# ----------------------------------------------------------------------------------------------
# vocabularies

_WORD_RE = re.compile(r"\w+|[^\w\s]")
_NO_SPACE_BEFORE = re.compile(r" (?=[.,!?;:%)\]}»'’])")
_NO_SPACE_AFTER = re.compile(r"([(\[{«¿¡'’]) ")


class Vocab:
    """Token <-> id mapping at ``word``, ``char`` or ``bpe`` level, with the four specials first.

    Word level splits into words and punctuation marks; char level keeps spaces as tokens; BPE
    level uses a byte-pair-encoding model trained on the training side (``tokenizers`` library,
    SentencePiece-style ``▁`` word boundaries so decoding restores the spaces).

    Build with :meth:`build`; save/restore with :meth:`to_dict` / :meth:`from_dict`.
    """

    def __init__(self, level: str, tokens: Sequence[str], bpe_json: str | None = None) -> None:
        if level not in LEVELS:
            raise UserError(f"unknown vocabulary level {level!r}; choose from {list(LEVELS)}")
        if tuple(tokens[:4]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}, got {tuple(tokens[:4])}")
        self.level = level
        self.itos = list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.bpe_json = bpe_json
        self._bpe = None
        if level == "bpe":
            if bpe_json is None:
                raise ValueError("a BPE vocabulary needs its tokenizer (bpe_json)")
            self._bpe = Tokenizer.from_str(bpe_json)

    # -- construction
    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        level: str = "word",
        *,
        min_freq: int = 1,
        bpe_vocab_size: int = 200,
    ) -> Vocab:
        """Collect a vocabulary from (already normalised) training texts.

        Args:
            texts: training sentences of one language side.
            level: ``word`` | ``char`` | ``bpe``.
            min_freq: word/char level: rarer tokens become ``<unk>``.
            bpe_vocab_size: BPE level: target vocabulary size (specials and characters included).
        """
        texts = list(texts)
        if level == "bpe":
            tok = Tokenizer(models.BPE(unk_token=UNK))
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
            tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
            trainer = trainers.BpeTrainer(
                vocab_size=bpe_vocab_size, special_tokens=list(SPECIALS), show_progress=False
            )
            tok.train_from_iterator(texts, trainer)
            vocab = tok.get_vocab()
            itos = sorted(vocab, key=vocab.get)
            return cls(level, itos, tok.to_str())
        if level not in LEVELS:
            raise UserError(f"unknown vocabulary level {level!r}; choose from {list(LEVELS)}")
        counts: Counter[str] = Counter()
        for t in texts:
            counts.update(split_tokens(t, level))
        kept = sorted(
            (t for t, c in counts.items() if c >= min_freq and t not in SPECIALS),
            key=lambda t: (-counts[t], t),
        )
        return cls(level, [*SPECIALS, *kept])

    def to_dict(self) -> dict:
        return {"level": self.level, "tokens": self.itos, "bpe": self.bpe_json}

    @classmethod
    def from_dict(cls, d: dict) -> Vocab:
        return cls(d["level"], d["tokens"], d.get("bpe"))

    def __len__(self) -> int:
        return len(self.itos)

    # -- text <-> tokens <-> ids
    def tokenize(self, text: str) -> list[str]:
        """Split a normalised sentence into this vocabulary's token strings."""
        if self._bpe is not None:
            return self._bpe.encode(text).tokens
        return split_tokens(text, self.level)

    def encode(self, text: str, *, strict: bool = False) -> list[int]:
        """Ids of ``text`` (no ``<start>``/``<end>``).

        Raises:
            UnknownTokens: ``strict`` and some tokens are not in the vocabulary (listed in the
                message and in its ``tokens``).
        """
        toks = self.tokenize(text)
        ids = [self.stoi.get(t, UNK_ID) for t in toks]
        if strict:
            unknown = [t for t, i in zip(toks, ids) if i == UNK_ID]
            if self._bpe is not None and unknown:  # BPE marks unknown characters as <unk> itself
                unknown = (
                    sorted(
                        {
                            c
                            for c in text
                            if c != " "
                            and self._bpe.token_to_id(c) is None
                            and self._bpe.token_to_id("▁" + c) is None
                        }
                    )
                    or unknown
                )
            if unknown:
                words = [t for t in self.stoi if t.strip() and not t.startswith("<")]
                shown = ", ".join(
                    repr(u) + did_you_mean(u, words) for u in list(dict.fromkeys(unknown))[:10]
                )
                raise UnknownTokens(
                    f"unknown {self.level} token(s) in {text!r}: {shown} "
                    f"(not in the {len(self)}-token training vocabulary)",
                    list(dict.fromkeys(unknown)),
                )
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, stopping at ``<end>`` and skipping ``<pad>``/``<start>``."""
        return self.join(self.id_tokens(ids))

    def id_tokens(self, ids: Iterable[int]) -> list[str]:
        """Token strings of ``ids`` up to (excluding) ``<end>``, without ``<pad>``/``<start>``."""
        out = []
        for i in ids:
            i = int(i)
            if i == END_ID:
                break
            if i in (PAD_ID, START_ID):
                continue
            out.append(self.itos[i] if 0 <= i < len(self.itos) else UNK)
        return out

    def join(self, tokens: Sequence[str]) -> str:
        """Inverse of :meth:`tokenize` (up to normalisation)."""
        if self.level == "char":
            return "".join(tokens)
        if self.level == "bpe":
            return "".join(tokens).replace("▁", " ").strip()
        # word level: spaces between words, none before closing punctuation, after opening
        # brackets or around apostrophes ("buongiorno, anna!", "dov'è"); a heuristic, since
        # the tokens do not record the original spacing
        text = " ".join(tokens)
        text = _NO_SPACE_BEFORE.sub("", text)
        text = _NO_SPACE_AFTER.sub(r"\1", text)
        return text


def split_tokens(text: str, level: str) -> list[str]:
    """Word level: words and punctuation marks; char level: characters (spaces included)."""
    if level == "char":
        return list(text)
    return _WORD_RE.findall(text)


# ----------------------------------------------------------------------------------------------
# the vocabularies of a run


class UnknownTokens(UserError):
    """Tokens of an input sentence that are not in the training vocabulary (``.tokens``)."""

    def __init__(self, message: str, tokens: list[str]) -> None:
        super().__init__(message)
        self.tokens = tokens


@dataclass
class TranslationVocabs:
    """What a run directory needs to turn text into ids and back (the "tokenizer" of a run)."""

    src: Vocab
    tgt: Vocab
    normalizer: Normalizer
    max_tgt_len: int = 64

    def encode_source(self, text: str, *, strict: bool = True) -> list[int]:
        """Normalise and encode one input sentence.

        Raises:
            UserError: an empty sentence, or (``strict``) tokens outside the source vocabulary.
        """
        norm = self.normalizer(text)
        if not norm:
            raise UserError("empty input sentence: nothing to translate")
        return self.src.encode(norm, strict=strict)

    def to_dict(self) -> dict:
        return {
            "src": self.src.to_dict(),
            "tgt": self.tgt.to_dict(),
            "normalizer": asdict(self.normalizer),
            "max_tgt_len": self.max_tgt_len,
        }

    def save(self, run_dir: str | Path) -> None:
        """Write ``vocab.json`` into ``run_dir`` (atomically)."""
        atomic_write_text(Path(run_dir) / VOCAB_FILE, json.dumps(self.to_dict()))


def load_vocabs(run_dir: str | Path) -> TranslationVocabs:
    """Read ``vocab.json`` of a translation run.

    Raises:
        UserError: the file is missing or corrupted.
    """
    path = Path(run_dir) / VOCAB_FILE
    if not path.exists():
        raise UserError(f"{run_dir} has no vocab.json (not a translation run?)")
    try:
        d = json.loads(path.read_text())
        return TranslationVocabs(
            Vocab.from_dict(d["src"]),
            Vocab.from_dict(d["tgt"]),
            Normalizer(**d["normalizer"]),
            int(d.get("max_tgt_len", 64)),
        )
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{path} is corrupted: {err}") from None
