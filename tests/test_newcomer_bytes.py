"""Issue 26, item 5: byte-level BPE output a person can read.

A multi-byte character split across tokens is held back until it is complete (never U+FFFD);
bytes that can never be UTF-8 are shown as ``\\xNN`` and ``attnlab generate`` says so on stderr;
a character cut by the end of generation is dropped, with a note. The token sequences are built
from single-byte tokens of a real byte-level BPE tokenizer, so every split is exercised.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnlab.decoding.text
from attnlab.cli import main
from attnlab.data.detokenize import StreamDecoder, _byte_of_symbol
from attnlab.data.tokenizers import ByteBPETokenizer, CharTokenizer, load_tokenizer

RUNS = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"
TEXT = "café costs 5 € 😀 ok"


@pytest.fixture(scope="module")
def bpe() -> ByteBPETokenizer:
    return ByteBPETokenizer.train("the cat sat on the mat. café € 😀\n" * 20, vocab_size=300)


def _byte_ids(tok, data: bytes) -> list[int]:
    """One token per byte (the 256 single-byte tokens every byte-level BPE has)."""
    symbol = {b: s for s, b in _byte_of_symbol().items()}
    return [tok.tokenizer.token_to_id(symbol[b]) for b in data]


def test_split_characters_wait_for_their_last_byte(bpe):
    dec = StreamDecoder(bpe)
    pieces = [dec.push(i) for i in _byte_ids(bpe, TEXT.encode())]
    assert "".join(pieces) + dec.finish() == TEXT
    assert not any("\ufffd" in p for p in pieces) and dec.invalid == dec.unfinished == 0
    euro = TEXT.encode().index("€".encode())
    assert pieces[euro : euro + 3] == ["", "", "€"]  # shown when its third byte arrives
    # the tokenizer's own merges (tokens that end or start inside a character) too
    dec = StreamDecoder(bpe)
    ids = bpe.encode(TEXT)
    assert "".join(dec.push(i) for i in ids) == TEXT == bpe.decode(ids)


def test_invalid_bytes_are_shown_and_counted(bpe):
    dec = StreamDecoder(bpe)
    # a lead byte followed by a space; a lone continuation byte; then valid text again
    text = "".join(dec.push(i) for i in _byte_ids(bpe, b"a\xc3 b\xa9c\xe2\x82\xac"))
    assert text == "a\\xc3 b\\xa9c€" and dec.invalid == 2
    assert "\ufffd" in bpe.decode(_byte_ids(bpe, b"a\xc3 b"))  # what decode() alone shows


def test_a_character_cut_by_the_end_is_dropped_and_counted(bpe):
    dec = StreamDecoder(bpe)
    assert "".join(dec.push(i) for i in _byte_ids(bpe, b"ok " + "😀".encode()[:3])) == "ok "
    assert dec.finish() == "" and dec.unfinished == 3 and dec.invalid == 0


def test_other_tokenizers_are_decoded_whole():
    tok = CharTokenizer.train("abc é")
    dec = StreamDecoder(tok)
    assert [dec.push(i) for i in tok.encode("é ab")] == ["é", " ", "a", "b"]


def _generate_with(monkeypatch, tokens: list[int]):
    """Make generation emit ``tokens`` (whatever the model would sample)."""

    def fake(model, idx, n, **kw):
        for t in tokens[:n]:
            yield torch.tensor([t])

    monkeypatch.setattr(attnlab.decoding.text, "stream_generate", fake)


@pytest.mark.parametrize("stream", [True, False])
def test_generate_prints_readable_text_and_says_what_was_wrong(monkeypatch, capsys, stream):
    run = RUNS / "lm_llama"  # a byte-level BPE run
    tok = load_tokenizer(run)
    no_stream = [] if stream else ["--no-stream"]
    _generate_with(monkeypatch, _byte_ids(tok, "é € ok".encode()))
    assert main(["generate", str(run), "--prompt", "The ", "-n", "9", *no_stream]) == 0
    res = capsys.readouterr()
    assert res.out == "The é € ok\n" and res.err == ""
    _generate_with(monkeypatch, _byte_ids(tok, b"x\xc3 y") + _byte_ids(tok, "😀".encode())[:2])
    assert main(["generate", str(run), "--prompt", "The ", "-n", "6", *no_stream]) == 0
    res = capsys.readouterr()
    assert res.out == "The x\\xc3 y\n" and "\ufffd" not in res.out
    assert "1 byte(s) that are not valid UTF-8" in res.err and "shown as \\xNN" in res.err
    assert "stopped inside a multi-byte character" in res.err
