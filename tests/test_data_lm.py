"""Tokenizers, corpora, the token-id cache, and the LM task: its config, batches and loss."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.config import LMTaskConfig, ModelConfig
from attnlab.data import corpus as corpus_mod
from attnlab.data.corpus import load_corpus, tokenize_cached
from attnlab.data.tokenizers import (
    ByteBPETokenizer,
    CharTokenizer,
    load_tokenizer,
    train_tokenizer,
)
from attnlab.errors import RunDirError, UserError
from attnlab.layers.moe import load_balancing_loss
from attnlab.models.lm import DecoderLM
from attnlab.tasks.lm import LMTask


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


TEXT = "def f(x):\n    return x * 2  # doubled\n\nclass Ünïcode:  pass\n" * 20


@pytest.fixture(scope="module")
def bpe():
    return ByteBPETokenizer.train(TEXT, vocab_size=300)


def test_char_tokenizer_roundtrip_and_unknown_characters_named():
    tok = CharTokenizer.train("hello world")
    assert tok.decode(tok.encode("hello")) == "hello"
    assert tok.vocab_size == len(set("hello world"))
    with pytest.raises(UserError, match=r"'Z'.*'é'|'é'.*'Z'") as err:
        tok.encode("hello Zé")
    assert "2 character(s)" in str(err.value)


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=40))
def test_byte_bpe_roundtrips_any_text(bpe, text):
    assert bpe.decode(bpe.encode(text)) == text


def test_bpe_learns_merges_and_vocab_size(bpe):
    assert 256 < bpe.vocab_size <= 300
    assert len(bpe.encode("    return x")) < len(b"    return x")  # merges compress
    with pytest.raises(UserError, match="256"):
        train_tokenizer("bpe", TEXT, vocab_size=100)
    with pytest.raises(UserError, match="unknown tokenizer"):
        train_tokenizer("word", TEXT)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_tokenizer_save_load(tmp_path, kind):
    tok = train_tokenizer(kind, TEXT, 300)
    tok.save(tmp_path)
    back = load_tokenizer(tmp_path)
    assert type(back) is type(tok) and back.fingerprint == tok.fingerprint
    assert back.encode("return x") == tok.encode("return x")


def test_corrupted_or_foreign_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(RunDirError, match="corrupted"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"hello": 1}')
    with pytest.raises(RunDirError, match="not an attnlab tokenizer"):
        load_tokenizer(tmp_path)
    with pytest.raises(RunDirError, match="no tokenizer.json"):
        load_tokenizer(tmp_path / "missing")


def test_builtin_corpora_are_deterministic_and_nonempty():
    a, b = load_corpus("pydoc"), load_corpus("pydoc")
    assert a.text == b.text and len(a.text) > 100_000 and "class" in a.text
    s = load_corpus("stdlib", max_chars=50_000)
    assert len(s.text) == 50_000 and "import" in s.text


def test_file_and_folder_corpora(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.txt").write_text("second")
    (tmp_path / "d" / "a.txt").write_text("first")
    (tmp_path / "d" / "blob.bin").write_bytes(b"\x00\x01\x02")
    (tmp_path / "d" / ".hidden").write_text("secret")
    assert load_corpus(str(tmp_path / "d")).text == "first\nsecond"
    assert load_corpus(str(tmp_path / "d" / "b.txt")).text == "second"


def test_unreadable_files(tmp_path, monkeypatch):
    """A file that cannot be read is skipped inside a folder, and a clear error on its own."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("first")
    (tmp_path / "d" / "locked.txt").write_text("secret")
    read = corpus_mod._read_text_file

    def flaky(path):
        if path.name == "locked.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return read(path)

    monkeypatch.setattr(corpus_mod, "_read_text_file", flaky)
    assert load_corpus(str(tmp_path / "d")).text == "first"
    with pytest.raises(UserError, match="cannot read corpus file .*Permission denied"):
        load_corpus(str(tmp_path / "d" / "locked.txt"))


def test_bad_corpora(tmp_path):
    with pytest.raises(UserError, match="unknown corpus 'wikipedia'"):
        load_corpus("wikipedia")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(UserError, match="empty"):
        load_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(UserError, match="empty"):
        load_corpus(str(tmp_path / "emptydir"))
    (tmp_path / "tiny.txt").write_text("abc")
    with pytest.raises(UserError, match="too few"):
        LMTask.build(LMTaskConfig(data=str(tmp_path / "tiny.txt"), seq_len=8))


def test_token_ids_are_cached_and_reused(tmp_path, monkeypatch):
    c = load_corpus("pydoc", max_chars=20_000)
    tok = CharTokenizer.train(c.text)
    ids = tokenize_cached(c, tok)
    assert isinstance(ids, np.memmap) and list(ids[:50]) == tok.encode(c.text[:50])
    files = list((tmp_path / "cache" / "tokens").iterdir())
    assert len(files) == 1

    def boom(*a, **k):
        raise AssertionError("re-tokenised")

    monkeypatch.setattr(corpus_mod, "_encode", boom)
    again = tokenize_cached(c, tok)
    assert np.array_equal(np.asarray(again), np.asarray(ids))
    other = CharTokenizer(sorted(set(c.text)) + ["\x07"])  # a different tokenizer: a new key
    with pytest.raises(AssertionError, match="re-tokenised"):
        tokenize_cached(c, other)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield LMTask.build(LMTaskConfig(data="pydoc", seq_len=32, seed=5, max_chars=60_000))
    mp.undo()


def test_batches_are_deterministic_in_seed_split_step(task):
    x1, y1 = task.get_batch("train", 7, 8)
    x2, y2 = task.get_batch("train", 7, 8)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, task.get_batch("train", 8, 8)[0])
    assert not torch.equal(x1, task.get_batch("val", 7, 8)[0][:, :32])
    other = LMTask(task.ids, task.tokenizer, task.config.replace(seed=6))
    assert not torch.equal(x1, other.get_batch("train", 7, 8)[0])
    assert x1.shape == (8, 32) and x1.dtype == torch.long
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the inputs shifted by one


def test_ranks_split_the_global_batch(task):
    full = task.get_batch("train", 3, 8)[0]
    parts = [task.get_batch("train", 3, 8, rank=r, world=2)[0] for r in range(2)]
    assert torch.equal(torch.cat(parts), full)


def test_splits_are_disjoint_tail_and_eval_batches_fixed(task):
    n = len(task.ids)
    assert len(task.splits["train"]) + len(task.splits["val"]) == n
    assert np.array_equal(task.splits["val"], task.ids[n - len(task.splits["val"]) :])
    a = [x for x, _ in task.eval_batches(4, 3)]
    b = [x for x, _ in task.eval_batches(4, 3)]
    assert len(a) == 3 and all(torch.equal(p, q) for p, q in zip(a, b))
    cfg = task.config_dict()
    assert cfg["type"] == "lm" and cfg["seq_len"] == 32 and cfg["tokenizer"] == "char"


def test_loss_adds_the_moe_aux_loss(task):
    """The task's loss is CE + moe_aux_coef × the load-balancing losses of every MoE layer,
    recomputed here from each layer's router on the input that layer saw."""
    model = DecoderLM(
        ModelConfig.preset(
            "mixtral-tiny", vocab_size=task.vocab_size, max_seq_len=32, moe_aux_coef=0.5
        )
    )
    batch = task.get_batch("train", 0, 4)
    loss, metrics = task.loss(model, batch, None)
    inputs = []
    hooks = [
        b.ffn.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in model.blocks
    ]
    logits = model(batch[0])
    for h in hooks:
        h.remove()
    aux = 0.0
    for block, x in zip(model.blocks, inputs):
        moe = block.ffn
        probs = moe.router(x.reshape(-1, x.shape[-1])).float().softmax(-1)  # (N, E)
        aux = aux + load_balancing_loss(probs, probs.topk(moe.top_k, -1).indices, moe.n_experts)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[1].flatten())
    torch.testing.assert_close(loss, ce + 0.5 * aux, atol=1e-5, rtol=0)
    assert metrics["aux"] == pytest.approx(float(aux.detach()), rel=1e-5) and metrics["aux"] > 0
    assert loss.requires_grad  # the aux term trains the routers
    loss.backward()
    assert all(b.ffn.router.weight.grad.abs().sum() > 0 for b in model.blocks)


def test_a_dense_model_has_no_aux_term(task):
    model = DecoderLM(ModelConfig.preset("tiny", vocab_size=task.vocab_size, max_seq_len=32))
    batch = task.get_batch("train", 0, 4)
    loss, metrics = task.loss(model, batch, None)
    ce = torch.nn.functional.cross_entropy(model(batch[0]).flatten(0, 1), batch[1].flatten())
    torch.testing.assert_close(loss, ce, atol=1e-6, rtol=0)
    assert metrics == {}


def test_task_config_is_config_json_task_and_reads_first_release_dicts(task):
    """config_dict() is config.json's "task": LMTaskConfig's fields plus the token counts, which
    LMTaskConfig accepts and drops on input (first-release run directories have them too)."""
    d = task.config_dict()
    assert d["n_tokens"] == {"train": len(task.splits["train"]), "val": len(task.splits["val"])}
    assert LMTaskConfig.from_dict(d) == task.config
    assert d["vocab_size"] == task.tokenizer.vocab_size and d["seed"] == 5
    first_release = {
        "type": "lm",
        "data": "pydoc",
        "tokenizer": "char",
        "vocab_size": 100,
        "seq_len": 64,
        "seed": 0,
        "val_fraction": 0.1,
        "max_chars": 200000,
        "n_tokens": {"train": 180000, "val": 20000},
    }
    cfg = LMTaskConfig.from_dict(first_release)
    assert cfg.seq_len == 64 and cfg.max_chars == 200000
    with pytest.raises(UserError, match="seq_len must be positive"):
        LMTaskConfig(seq_len=0)
    with pytest.raises(UserError, match="unknown LMTaskConfig field"):
        LMTaskConfig.from_dict({"seq_lenn": 3})
    with pytest.raises(UserError, match="tokenizer"):
        LMTaskConfig(tokenizer="word")


def test_from_config_rebuilds_the_same_batches(task):
    again = LMTask.from_config(task.config_dict(), task.tokenizer)
    assert again.config == task.config
    assert torch.equal(again.get_batch("train", 3, 4)[0], task.get_batch("train", 3, 4)[0])
    with pytest.raises(UserError, match="not a language-modelling task"):
        LMTask.from_config({"type": "translation"}, task.tokenizer)
