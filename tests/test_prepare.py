"""Streaming corpus preparation: the ids equal the in-memory encoding however the text is cut,
the held-out split by blocks, skipped files, the empty corpus, the cache, and first-release runs
whose tasks still rebuild to the same token counts."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.config import LMTaskConfig
from attnlab.data import encoding, prepare, textstream
from attnlab.data.corpus import _encode
from attnlab.data.prepare import open_prepared, prepare_cached, prepare_corpus
from attnlab.data.shards import BlockSplit
from attnlab.data.tokenizers import ByteBPETokenizer, CharTokenizer, load_tokenizer
from attnlab.errors import UserError
from attnlab.tasks.lm import LMTask

RELEASE = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"

# words, multi-byte characters (2, 3 and 4 bytes), indentation, odd whitespace, long lines
DOC_A = (
    "def größe(x):\n    return x * 2  # verdoppelt → ½\n\n\tclass Ünïcode:  pass\n"
    "emoji 🙂🙂 and   spaces\x0cform feed\r\nwindows line\rold mac\u2028sep\n"
    * 15
    + "a-very-long-line " * 40
    + "\n"
)
DOC_B = "日本語のテキスト、句読点。\n  indented  text with trailing spaces   \n" * 25


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Read 7 bytes at a time (cuts inside multi-byte characters and words), cut pieces past 40
    characters, batch 64 characters: every boundary of the streaming path is exercised."""
    monkeypatch.setattr(textstream, "READ_BYTES", 7)
    monkeypatch.setattr(textstream, "MAX_PIECE_CHARS", 40)
    monkeypatch.setattr(prepare, "BATCH_CHARS", 64)


@pytest.fixture(scope="module")
def bpe():
    return ByteBPETokenizer.train(DOC_A + DOC_B, vocab_size=300)


def _folder(root: Path) -> Path:
    d = root / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text(DOC_A, encoding="utf-8")
    (d / "sub" / "b.md").write_text(DOC_B, encoding="utf-8")
    return d


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_streamed_ids_equal_the_in_memory_encoding(tmp_path, tiny_chunks, kind, bpe):
    """Text read 7 bytes at a time, cut into 40-character pieces and 64-character batches gives
    exactly the first release's in-memory ids (the folder's files joined by a newline)."""
    d = _folder(tmp_path)
    tok = bpe if kind == "bpe" else None
    summary = prepare_corpus(str(d), tmp_path / "out", kind=kind, tokenizer=tok, workers=0)
    prepared = open_prepared(tmp_path / "out")
    text = DOC_A + "\n" + DOC_B
    if kind == "char":
        assert prepared.tokenizer.chars == CharTokenizer.train(text).chars
    expected = _encode(prepared.tokenizer, DOC_A) + _encode(prepared.tokenizer, "\n" + DOC_B)
    if kind == "char":
        assert expected == _encode(prepared.tokenizer, text)
    assert np.asarray(prepared.ids).tolist() == expected
    assert summary.n_tokens == len(expected)
    assert prepared.ids.dtype == np.uint16


def test_one_document_equals_the_in_memory_encoding_of_the_whole_text(tmp_path, bpe, monkeypatch):
    """One file (the first release's single-file corpus): ids equal ``_encode(text)``, which
    encodes groups of 256 lines, even with every piece cut at 40 characters."""
    monkeypatch.setattr(textstream, "READ_BYTES", 5)
    monkeypatch.setattr(textstream, "MAX_PIECE_CHARS", 40)
    text = (DOC_A + DOC_B) * 3  # more than 256 lines
    (tmp_path / "one.txt").write_text(text, encoding="utf-8")
    prepare_corpus(str(tmp_path / "one.txt"), tmp_path / "out", tokenizer=bpe, workers=0)
    ids = np.asarray(open_prepared(tmp_path / "out").ids).tolist()
    assert ids == _encode(bpe, text)
    assert bpe.decode(ids) == text


def test_bpe_part_split_is_exact_on_any_whitespace(bpe):
    """The encoder's split into cached parts, and its joined encoding of new parts, never change
    the ids (odd whitespace, contractions, multi-byte characters included)."""
    enc = encoding.PieceEncoder(bpe)
    for text in [DOC_A, DOC_B, " \x0b x\x1c y\x85 z\xa0 w  \u3000 ", "x\n\n  \t\r\n y ", ""]:
        assert enc([text]).tolist() == bpe.encode(text), repr(text)
        assert enc([text]).tolist() == bpe.encode(text)  # from the cache


ALPHABET = list("ab é½日🙂'1.(_\t\n\r\x0c\x85  ")


@pytest.fixture(scope="module")
def mixed_bpe():
    """BPE with merges across every kind of character boundary (letters, digits, punctuation,
    non-ASCII letters and numbers, apostrophes, whitespace)."""
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(ALPHABET, size=200_000))
    return ByteBPETokenizer.train(text, vocab_size=1000)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=300))
def test_bpe_piece_encoder_equals_the_library_on_random_text(mixed_bpe, chars):
    text = "".join(chars)
    ref = mixed_bpe.encode(text) + mixed_bpe.encode(text[::-1])
    assert encoding.PieceEncoder(mixed_bpe)([text, text[::-1]]).tolist() == ref


@pytest.mark.parametrize("bound", [1, 7, 60])
def test_bpe_cache_eviction_keeps_every_id(mixed_bpe, monkeypatch, bound):
    """With the caches bounded to a few entries, so that they are emptied in the middle of
    batches whose other words and parts were found in them, every id still equals the uncached
    encoding, on text of many distinct words that also repeat (the 1 GB corpus's ``KeyError``)."""
    monkeypatch.setattr(encoding, "CACHE_ENTRIES", bound)
    rng = np.random.default_rng(bound)
    vocab = ["".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 7))) for _ in range(400)]
    pieces = [
        " ".join(rng.choice(vocab, size=12)) + rng.choice(["\n", ".\n", "  x1(", "\t'é "])
        for _ in range(120)
    ]
    enc = encoding.PieceEncoder(mixed_bpe)
    cleared = 0
    for i in range(0, len(pieces), 4):
        batch = pieces[i : i + 4]
        before = len(enc.words)
        assert enc(batch).tolist() == [t for p in batch for t in mixed_bpe.encode(p)]
        cleared += len(enc.words) < before
    assert cleared > 3  # the bound was reached, more than once, with known words in the batch


def test_worker_processes_give_the_same_ids(tmp_path, bpe, monkeypatch):
    monkeypatch.setattr(prepare, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(prepare, "BATCH_CHARS", 256)
    d = _folder(tmp_path)
    prepare_corpus(str(d), tmp_path / "pool", tokenizer=bpe, workers=2)
    prepare_corpus(str(d), tmp_path / "local", tokenizer=bpe, workers=0)
    a, b = (np.asarray(open_prepared(tmp_path / n).ids) for n in ("pool", "local"))
    assert np.array_equal(a, b) and len(a) > 100


def test_skipped_files_are_counted_not_fatal(tmp_path):
    d = _folder(tmp_path)
    (d / "blob.bin").write_bytes(b"\x00\x01\x02text")
    (d / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (d / "empty.txt").write_text("")
    (d / ".hidden").write_text("secret")
    summary = prepare_corpus(str(d), tmp_path / "out", workers=0)
    assert summary.skipped == {"binary": 1, "not_utf8": 1, "empty": 1, "unreadable": 0}
    prepared = open_prepared(tmp_path / "out")
    assert prepared.tokenizer.decode(np.asarray(prepared.ids)) == DOC_A + "\n" + DOC_B


def test_an_empty_corpus_is_one_clear_error(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "blob.bin").write_bytes(b"\x00\x01")
    (d / "empty.txt").write_text("")
    for kind in ("char", "bpe"):
        with pytest.raises(UserError, match=r"empty: no text.*1 binary, 1 empty"):
            prepare_corpus(str(d), tmp_path / f"out-{kind}", kind=kind, vocab_size=300)
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    with pytest.raises(UserError, match=r"empty: no text.*1 not-utf8"):
        prepare_cached(str(tmp_path / "latin1.txt"))
    (tmp_path / "blank.txt").write_text(" \n\n ")
    with pytest.raises(UserError, match="empty: no text"):
        prepare_corpus(str(tmp_path / "blank.txt"), tmp_path / "out-blank")
    with pytest.raises(UserError, match="unknown corpus 'wikipedia'"):
        prepare_cached("wikipedia")


def test_bpe_sample_is_bounded_seeded_and_only_reads_its_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "SAMPLE_BLOCK", 256)
    big = tmp_path / "big.txt"
    big.write_text("".join(f"line {i} of the corpus\n" for i in range(20000)))
    docs = textstream.plan_corpus(str(big))
    a = list(prepare.bpe_sample(docs, 2000, seed=1))
    assert a == list(prepare.bpe_sample(docs, 2000, seed=1))
    assert a != list(prepare.bpe_sample(docs, 2000, seed=2))
    assert 1000 < sum(map(len, a)) <= 2000 + 256
    assert all(t.endswith("\n") and t.startswith("line ") for t in a)  # whole lines
    small = list(prepare.bpe_sample(docs, 10**9, seed=1))  # larger than the corpus: all of it
    assert "".join(small) == big.read_text()


def test_block_split_partitions_the_stream():
    ids = np.arange(10_000)
    train = BlockSplit(ids, "train", 0.1, block=1000, min_val=5)
    val = BlockSplit(ids, "val", 0.1, block=1000, min_val=5)
    t, v = np.asarray(train), np.asarray(val)
    assert len(t) + len(v) == 10_000 and not set(t) & set(v)
    assert np.array_equal(np.sort(np.concatenate([t, v])), ids)
    assert np.array_equal(v[:100], np.arange(900, 1000))  # the last 10 % of every block
    ragged = np.arange(10_500)  # a last, partial block: its last 10 % too
    rv = np.asarray(BlockSplit(ragged, "val", 0.1, block=1000))
    assert np.array_equal(rv[-50:], np.arange(10_450, 10_500)) and len(rv) == 1050
    one = BlockSplit(ids, "val", 0.1, block=None, min_val=5)  # one block: the tail
    assert np.array_equal(np.asarray(one), np.arange(9000, 10_000))
    assert np.array_equal(np.asarray(BlockSplit(ids[:30], "val", 0.1, None, min_val=5)), ids[25:30])


def test_first_release_configs_keep_the_tail_split():
    d = json.loads((RELEASE / "lm_llama" / "config.json").read_text())["task"]
    assert LMTaskConfig.from_dict(d).val_block is None
    assert LMTaskConfig.from_dict({"data": "pydoc"}).val_block == 1 << 20
    new = LMTaskConfig(val_block=4096)
    assert LMTaskConfig.from_dict({**new.to_dict(), "n_tokens": {}}).val_block == 4096


@pytest.mark.parametrize("run", ["lm_gpt2", "lm_llama"])
def test_first_release_runs_rebuild_the_same_splits(run):
    """A first-release run's task, rebuilt through the streaming path with the run's tokenizer,
    has the token counts the run recorded (same ids, same tail split): it evaluates the same."""
    task_dict = json.loads((RELEASE / run / "config.json").read_text())["task"]
    task = LMTask.from_config(task_dict, load_tokenizer(RELEASE / run))
    assert task.n_tokens == task_dict["n_tokens"]


def test_the_cache_prepares_once(tmp_path, monkeypatch):
    (tmp_path / "c.txt").write_text(DOC_A)
    first = prepare_cached(str(tmp_path / "c.txt"), kind="bpe", vocab_size=280)

    def boom(*a, **k):
        raise AssertionError("prepared again")

    monkeypatch.setattr(prepare, "_encode_documents", boom)
    monkeypatch.setattr(prepare, "train_corpus_tokenizer", boom)
    again = prepare_cached(str(tmp_path / "c.txt"), kind="bpe", vocab_size=280)
    assert again.directory == first.directory
    assert np.array_equal(np.asarray(again.ids), np.asarray(first.ids))
    (tmp_path / "c.txt").write_text(DOC_B)  # the file changed: a new entry
    with pytest.raises(AssertionError, match="prepared again"):
        prepare_cached(str(tmp_path / "c.txt"), kind="bpe", vocab_size=280)
