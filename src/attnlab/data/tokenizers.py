"""Tokenizers: characters, or byte-level BPE trained locally with Hugging Face ``tokenizers``.

Both have ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``, ``save(dir)``
(``tokenizer.json`` in a run directory) and ``fingerprint`` (a hash of the saved form, so cached
token ids are keyed by the exact tokenizer). :func:`load_tokenizer` reads either kind back.

- Character level: the vocabulary is the sorted set of characters in the training text. Text with
  a character outside it cannot be encoded; that is a user error naming the characters.
- Byte-level BPE (GPT-2's scheme): text is UTF-8 bytes mapped to 256 printable symbols, and merges
  of frequent pairs are learned up to ``vocab_size``. Every string can be encoded.

:func:`as_hf_tokenizer` gives either kind as a Hugging Face ``tokenizers.Tokenizer`` (a character
tokenizer becomes a ``WordLevel`` model over one-character pieces with a ``Fuse`` decoder), so
``attnlab convert --to-hf`` writes a ``tokenizer.json`` that ``transformers.AutoTokenizer`` opens;
:func:`tokenizer_from_json` reads that form back as a :class:`CharTokenizer`.

Masked-LM runs add BERT's special tokens ``[PAD] [CLS] [SEP] [MASK]`` (:data:`SPECIAL_TOKENS`) with
:class:`TokenizerWithSpecials` (``train_tokenizer(..., specials=True)``): the four tokens get the
ids after the plain vocabulary, so text without them encodes exactly as before, and a
language-model tokenizer (and its ``tokenizer.json``) is untouched. T5's span corruption adds
``<pad> </s> <extra_id_0> … <extra_id_{n−1}>`` the same way (:func:`t5_specials`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from attnlab.errors import RunDirError, UserError
from attnlab.fileio import atomic_write_text

__all__ = [
    "CharTokenizer",
    "ByteBPETokenizer",
    "as_hf_tokenizer",
    "TokenizerWithSpecials",
    "SPECIAL_TOKENS",
    "t5_specials",
    "load_tokenizer",
    "train_tokenizer",
    "TOKENIZER_FILE",
]

TOKENIZER_FILE = "tokenizer.json"
#: BERT's special tokens, in the order of their ids (after the plain vocabulary)
SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


def t5_specials(n_sentinels: int) -> tuple[str, ...]:
    """T5's specials for span corruption: ``<pad>`` (also the decoder's start), ``</s>`` and
    ``n_sentinels`` sentinels ``<extra_id_0>`` … (one per corrupted span of an input)."""
    return ("<pad>", "</s>", *(f"<extra_id_{i}>" for i in range(n_sentinels)))


def _known_specials(specials: object) -> bool:
    """BERT's four, or T5's (``<pad> </s>`` and sentinels numbered from 0)."""
    if specials == list(SPECIAL_TOKENS):
        return True
    return (
        isinstance(specials, list)
        and len(specials) > 2
        and specials == list(t5_specials(len(specials) - 2))
    )


class _SavedTokenizer:
    """What both tokenizers share: the saved form is ``to_json()`` (defined by each)."""

    def to_json(self) -> str:
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        """A hash of the saved form (keys the token-id cache)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` into ``directory`` (atomically)."""
        path = Path(directory) / TOKENIZER_FILE
        atomic_write_text(path, self.to_json())
        return path


class CharTokenizer(_SavedTokenizer):
    """One id per character of a fixed alphabet.

    Args:
        chars: the alphabet, in id order (duplicates are not allowed).
    """

    type = "char"

    def __init__(self, chars: list[str] | str) -> None:
        chars = list(chars)
        if not chars:
            raise UserError("a character tokenizer needs at least one character")
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise UserError("character vocabulary must be distinct single characters")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """The sorted set of characters in ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``.

        Raises:
            UserError: ``text`` has characters outside the vocabulary (named in the message).
        """
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            unknown = sorted(set(text) - set(self.stoi))
            shown = ", ".join(repr(c) for c in unknown[:10]) + (" …" if len(unknown) > 10 else "")
            raise UserError(
                f"{len(unknown)} character(s) not in this model's character vocabulary "
                f"({self.vocab_size} characters): {shown}"
            ) from None

    def decode(self, ids) -> str:
        try:
            return "".join(self.chars[int(i)] for i in ids)
        except IndexError:
            raise UserError(f"token id out of range (vocabulary {self.vocab_size})") from None

    def to_json(self) -> str:
        return json.dumps({"type": "char", "chars": self.chars}, ensure_ascii=False)


class ByteBPETokenizer(_SavedTokenizer):
    """Byte-level BPE (as GPT-2) on top of a ``tokenizers.Tokenizer``.

    Args:
        tokenizer: a trained ``tokenizers.Tokenizer`` with a ByteLevel pre-tokenizer and decoder.
    """

    type = "bpe"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, text: str, vocab_size: int = 512) -> ByteBPETokenizer:
        """Learn merges on ``text`` until ``vocab_size`` tokens (at least the 256 byte symbols).

        Raises:
            UserError: ``vocab_size`` below 256.
        """
        # feed lines in chunks: the trainer counts words per chunk, order does not matter
        lines = text.splitlines(keepends=True)
        return cls.train_from_iterator(
            ("".join(lines[i : i + 200]) for i in range(0, len(lines), 200)), vocab_size
        )

    @classmethod
    def train_from_iterator(cls, texts: Iterable[str], vocab_size: int = 512) -> ByteBPETokenizer:
        """Learn merges on the texts an iterator yields (streamed into the trainer, which only
        keeps word counts).

        Raises:
            UserError: ``vocab_size`` below 256.
        """
        if vocab_size < 256:
            raise UserError(
                "a byte-level BPE vocabulary needs at least 256 tokens (one per "
                f"byte); "
                f"got --vocab-size {vocab_size}"
            )
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_json(self) -> str:
        return self.tokenizer.to_str()

    @classmethod
    def from_json(cls, text: str) -> ByteBPETokenizer:
        return cls(Tokenizer.from_str(text))


class TokenizerWithSpecials(_SavedTokenizer):
    """A char or BPE tokenizer plus special tokens: BERT's ``[PAD] [CLS] [SEP] [MASK]``, or T5's
    ``<pad> </s> <extra_id_0> …`` (:func:`t5_specials`).

    The specials take the ids ``base.vocab_size + 0, 1, …`` (in ``specials`` order), so
    every other id means what it means in ``base``. ``encode`` reads the special tokens' text
    (``"a [MASK] b"`` gives one ``[MASK]`` id), everything else through ``base``; a corpus is
    tokenised with ``base`` (a literal ``[MASK]`` in it stays characters).

    Saved form: a character tokenizer's JSON gains ``"specials"``; a BPE ``tokenizer.json`` lists
    them as added special tokens (a Hugging Face ``tokenizers`` file that reads them too).

    Args:
        base: the plain tokenizer.
        specials: the special tokens (default BERT's).
    """

    def __init__(
        self, base: CharTokenizer | ByteBPETokenizer, specials: tuple[str, ...] = SPECIAL_TOKENS
    ) -> None:
        if isinstance(base, TokenizerWithSpecials):
            base = base.base
        self.base = base
        self.type = base.type
        self.specials = tuple(specials)
        n = base.vocab_size
        self.special_ids = {tok: n + i for i, tok in enumerate(self.specials)}
        # longest first, so that <extra_id_10> is not read as <extra_id_1> and "0>"
        alternatives = sorted(self.specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(t) for t in alternatives) + ")")

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size + len(self.specials)

    @property
    def pad_id(self) -> int:
        return self.special_ids["[PAD]"]

    @property
    def cls_id(self) -> int:
        return self.special_ids["[CLS]"]

    @property
    def sep_id(self) -> int:
        return self.special_ids["[SEP]"]

    @property
    def mask_id(self) -> int:
        return self.special_ids["[MASK]"]

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, its ``[PAD] [CLS] [SEP] [MASK]`` read as the special tokens.

        Raises:
            UserError: characters outside a character vocabulary (named).
        """
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece:
                ids.extend(self.base.encode(piece))
        return ids

    def decode(self, ids) -> str:
        out, run = [], []
        for i in (int(i) for i in ids):
            if i >= self.base.vocab_size:
                if i >= self.vocab_size:
                    raise UserError(f"token id out of range (vocabulary {self.vocab_size})")
                out.append(self.base.decode(run) if run else "")
                out.append(self.specials[i - self.base.vocab_size])
                run = []
            else:
                run.append(i)
        out.append(self.base.decode(run) if run else "")
        return "".join(out)

    def to_json(self) -> str:
        data = json.loads(self.base.to_json())
        if self.type == "char":
            data["specials"] = list(self.specials)
            return json.dumps(data, ensure_ascii=False)
        data["added_tokens"] = [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for tok, i in self.special_ids.items()
        ]
        return json.dumps(data, ensure_ascii=False)


def as_hf_tokenizer(tok: CharTokenizer | ByteBPETokenizer | TokenizerWithSpecials):
    """The tokenizer as a Hugging Face ``tokenizers.Tokenizer`` with the same ids.

    A character tokenizer becomes a ``WordLevel`` model whose vocabulary is the alphabet, a
    pre-tokenizer that splits text into single characters and a ``Fuse`` decoder (ids -> the
    characters joined); BERT's specials, if any, are added special tokens with their ids. A BPE
    tokenizer is its own ``tokenizers`` object.
    """
    base = tok.base if isinstance(tok, TokenizerWithSpecials) else tok
    if isinstance(base, ByteBPETokenizer):
        return Tokenizer.from_str(tok.to_json())
    hf = Tokenizer(models.WordLevel(dict(base.stoi), unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    hf.decoder = decoders.Fuse()
    if isinstance(tok, TokenizerWithSpecials):
        hf.add_special_tokens(list(SPECIAL_TOKENS))  # ids base.vocab_size + 0 ... 3
    return hf


def _hf_char_tokenizer(data: dict) -> CharTokenizer | TokenizerWithSpecials | None:
    """The character tokenizer that :func:`as_hf_tokenizer` wrote as ``data``, or None when
    ``data`` is another kind of ``tokenizers`` JSON."""
    model, pre, dec = data.get("model") or {}, data.get("pre_tokenizer"), data.get("decoder")
    vocab = model.get("vocab")
    if model.get("type") != "WordLevel" or not isinstance(vocab, dict) or not vocab:
        return None
    if (pre or {}).get("type") != "Split" or (dec or {}).get("type") != "Fuse":
        return None
    chars = sorted(vocab, key=vocab.get)
    if any(len(c) != 1 for c in chars) or sorted(vocab.values()) != list(range(len(chars))):
        return None
    added = [a.get("content") for a in data.get("added_tokens") or [] if isinstance(a, dict)]
    if added not in ([], list(SPECIAL_TOKENS)):
        return None
    tok = CharTokenizer(chars)
    return TokenizerWithSpecials(tok) if added else tok


def _bpe_specials(data: dict) -> tuple[str, ...] | None:
    """The specials a BPE tokenizer.json lists after its plain vocabulary, when they are BERT's
    or T5's (then they are removed from ``data``: :class:`TokenizerWithSpecials` adds them
    back); None otherwise."""
    added = data.get("added_tokens") or []
    names = [a.get("content") for a in added if isinstance(a, dict)]
    if not _known_specials(names):
        return None
    ids = [a.get("id") for a in added]
    n = len((data.get("model") or {}).get("vocab") or {})
    if ids != list(range(n, n + len(names))):
        return None
    data["added_tokens"] = []
    return tuple(names)


def train_tokenizer(
    kind: str, text: str, vocab_size: int = 512, *, specials: bool = False
) -> CharTokenizer | ByteBPETokenizer | TokenizerWithSpecials:
    """Train a ``char`` or ``bpe`` tokenizer on ``text``.

    Args:
        specials: add ``[PAD] [CLS] [SEP] [MASK]`` (:class:`TokenizerWithSpecials`; masked LM).

    Raises:
        UserError: unknown kind or unusable vocabulary size.
    """
    if kind == "char":
        tok: CharTokenizer | ByteBPETokenizer = CharTokenizer.train(text)
    elif kind == "bpe":
        tok = ByteBPETokenizer.train(text, vocab_size)
    else:
        raise UserError(f"unknown tokenizer {kind!r}; choose 'char' or 'bpe'")
    return TokenizerWithSpecials(tok) if specials else tok


def tokenizer_from_json(
    text: str, source: str = "tokenizer"
) -> CharTokenizer | ByteBPETokenizer | TokenizerWithSpecials:
    """Rebuild a tokenizer from the text of its ``tokenizer.json``.

    Raises:
        RunDirError: the text is not a tokenizer attnlab wrote.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise RunDirError(f"{source} is corrupted: {err}") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{source} is not an attnlab tokenizer (neither char nor BPE)")
    if data.get("type") == "char" and isinstance(data.get("chars"), list):
        specials = data.get("specials")
        if specials is not None and not _known_specials(specials):
            raise RunDirError(f"{source}: unknown special tokens {specials!r}")
        tok = CharTokenizer(data["chars"])
        return tok if specials is None else TokenizerWithSpecials(tok, tuple(specials))
    if isinstance(data.get("model"), dict):
        char = _hf_char_tokenizer(data)  # a character tokenizer exported for Hugging Face
        if char is not None:
            return char
        specials = _bpe_specials(data)
        try:
            bpe = ByteBPETokenizer.from_json(json.dumps(data) if specials else text)
        except Exception as err:  # tokenizers raises its own exception type
            raise RunDirError(f"{source} is not a readable tokenizer: {err}") from None
        return TokenizerWithSpecials(bpe, specials) if specials else bpe
    raise RunDirError(f"{source} is not an attnlab tokenizer (neither char nor BPE)")


def load_tokenizer(
    run_dir: str | os.PathLike,
) -> CharTokenizer | ByteBPETokenizer | TokenizerWithSpecials:
    """The tokenizer saved in a run directory.

    Raises:
        RunDirError: the file is missing, corrupted or foreign.
    """
    path = Path(run_dir) / TOKENIZER_FILE
    if not path.exists():
        raise RunDirError(f"{str(run_dir)!r} has no {TOKENIZER_FILE}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RunDirError(f"{path} is corrupted: {err}") from None
    return tokenizer_from_json(text, str(path))
