"""Turning generated ids into text as they arrive, without showing half a character.

A byte-level BPE token is a run of UTF-8 *bytes*, not of characters: ``é`` (two bytes) or ``€``
(three) may be split across tokens, and a model may also emit bytes that are not UTF-8 at all
(a continuation byte with no lead byte, a lead byte followed by another lead byte). Decoding the
ids seen so far with ``tokenizer.decode`` shows U+FFFD for both: for the first, only until the
rest of the character arrives; for the second, for good.

:class:`StreamDecoder` keeps the two apart. It feeds each token's bytes to an incremental UTF-8
decoder, which holds back the bytes of an incomplete character until they are complete, and
writes bytes that can never be UTF-8 visibly as ``\\xNN`` (``invalid`` counts them), so the
caller can say that the model, not the decoder, produced them. A character left incomplete when
generation stops (``-n`` ran out inside it) is dropped at :meth:`finish` and counted in
``unfinished``.

    dec = StreamDecoder(tokenizer)
    for token in ...:
        print(dec.push(token), end="")
    print(dec.finish())
    if dec.invalid: ...   # say so

Tokenizers that are not byte-level (characters; Hugging Face tokenizers with another decoder)
are decoded as a whole each time and the new text is what was added.
"""

from __future__ import annotations

import codecs
import json
from functools import lru_cache

__all__ = ["StreamDecoder", "token_bytes_table"]


@lru_cache(maxsize=1)
def _byte_of_symbol() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable symbol of each byte -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in keep:
            symbols[chr(b)] = b
        else:
            symbols[chr(256 + extra)] = b
            extra += 1
    return symbols


def token_bytes_table(tokenizer) -> list[bytes] | None:
    """The bytes of every id of a byte-level BPE ``tokenizers.Tokenizer`` (added tokens as their
    UTF-8 text), or None when the tokenizer is not byte-level."""
    data = json.loads(tokenizer.to_str())
    if (data.get("decoder") or {}).get("type") != "ByteLevel":
        return None
    symbols = _byte_of_symbol()
    added = {a["id"]: a["content"] for a in data.get("added_tokens") or []}
    table = []
    for i in range(tokenizer.get_vocab_size()):
        if i in added:
            table.append(added[i].encode())
            continue
        piece = tokenizer.id_to_token(i) or ""
        if not all(c in symbols for c in piece):
            return None  # not GPT-2's alphabet after all
        table.append(bytes(symbols[c] for c in piece))
    return table


#: the decoders decoding right now (the error handler counts into the innermost)
_ACTIVE: list[StreamDecoder] = []


def _invalid_as_hex(err: UnicodeDecodeError) -> tuple[str, int]:
    bad = err.object[err.start : err.end]
    if _ACTIVE:
        _ACTIVE[-1].invalid += len(bad)
    return "".join(f"\\x{b:02x}" for b in bad), err.end


codecs.register_error("attnlab-hex", _invalid_as_hex)


class StreamDecoder:
    """Text of generated ids, one id at a time (see the module docstring).

    Args:
        tokenizer: an attnlab tokenizer (``decode(ids)``); a byte-level BPE one is decoded byte
            by byte.

    Attributes:
        invalid: how many bytes were not UTF-8 (shown as ``\\xNN``).
        unfinished: after :meth:`finish`, the bytes of a last character left incomplete.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        inner = getattr(tokenizer, "tokenizer", None)  # ByteBPETokenizer wraps tokenizers'
        self._bytes = token_bytes_table(inner) if inner is not None else None
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="attnlab-hex")
        self._ids: list[int] = []
        self._text = ""
        self.invalid = 0
        self.unfinished = 0

    def _decode(self, data: bytes, final: bool = False) -> str:
        _ACTIVE.append(self)
        try:
            return self._utf8.decode(data, final=final)
        finally:
            _ACTIVE.pop()

    def push(self, token: int) -> str:
        """The text that ``token`` completes (``""`` while a character is incomplete)."""
        if self._bytes is not None and 0 <= int(token) < len(self._bytes):
            return self._decode(self._bytes[int(token)])
        self._ids.append(int(token))
        text = self.tokenizer.decode(self._ids)
        new, self._text = text[len(self._text) :], text
        return new

    def finish(self) -> str:
        """The end of the text: ``""``. The bytes of a character that the last token left
        unfinished (generation stopped inside it) are dropped and counted in ``unfinished``:
        they are not the model's mistake, only the budget's."""
        if self._bytes is not None:
            pending, _ = self._utf8.getstate()  # (always a valid start of a character)
            self.unfinished = len(pending)
            self._utf8.reset()
        return ""
