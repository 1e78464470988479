"""Captioners: causal decoders, cross-attention maps, incremental decoding against teacher
forcing, beam search against exhaustive search, frozen encoders, every block option, and a short
training run that names what is in the image."""

import itertools
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

import attnlab.tasks.caption as cap
from attnlab.attention.cache import DecodeState
from attnlab.config.multimodal import CaptionConfig
from attnlab.data.scenes import SceneConfig, SceneSet, Vocab, build_vocab, images_to_tensor
from attnlab.decoding.search import length_penalty
from attnlab.errors import UserError
from attnlab.experiments.caption_retrieval import nearest_neighbour_captions
from attnlab.metrics.captions import score_captions
from attnlab.models.multimodal.captioner import (
    LSTMCaptioner,
    TransformerCaptioner,
    build_captioner,
)
from attnlab.runs import load
from attnlab.tasks.caption import CaptionTask, caption_metrics, decode_captions
from attnlab.train import TrainConfig, train

V = len(build_vocab())
BANNED = (Vocab.PAD, Vocab.START)  # never generated


def tiny(arch, **kw):
    return build_captioner(CaptionConfig.preset("tiny", arch=arch, vocab_size=V, **kw)).eval()


def tokens(B=3, L=9, vocab_size=V):
    t = torch.randint(4, vocab_size, (B, L))
    t[:, 0] = Vocab.START
    return t


@pytest.mark.parametrize(
    "arch,encoder", [("lstm", "cnn"), ("transformer", "cnn"), ("transformer", "vit")]
)
def test_decoder_is_causal(arch, encoder):
    m = tiny(arch, encoder=encoder)
    x, t = torch.rand(3, 3, 32, 32), tokens()
    ref = m(x, t)
    for pos in (3, 8):
        t2 = t.clone()
        t2[:, pos] = (t2[:, pos] + 1 - 4) % (V - 4) + 4  # a different later word
        out = m(x, t2)
        torch.testing.assert_close(out[:, :pos], ref[:, :pos])
        assert not torch.allclose(out[:, pos], ref[:, pos])


@pytest.mark.parametrize("encoder", ["cnn", "vit"])
def test_cross_attention_weights_are_distributions_over_the_stated_grid(encoder):
    m = tiny("transformer", encoder=encoder, n_layers=2)
    assert m.encoder.grid == (8, 8)  # 32 / 2 / 2 for the 3-stage CNN, 32 / 4 for ViT patches
    logits, weights = m(torch.rand(2, 3, 32, 32), tokens(2, 6), need_weights=True)
    assert logits.shape == (2, 6, V) and len(weights) == 2
    for w in weights:
        assert w.shape == (2, m.config.n_heads, 6, 64) and w.min() >= 0
        torch.testing.assert_close(w.sum(-1), torch.ones(2, m.config.n_heads, 6))
    assert not any(hasattr(mod, "cross_weights") for mod in m.modules())  # nothing kept


def recomputed_cross_attention(model, forward):
    """Call ``forward()`` with a hook on every block's cross-attention, and return what each
    returned plus softmax(q kᵀ / √d) per block, recomputed from the layer's own projections of
    the inputs it was given (grouped-query heads expanded)."""
    inputs = {}
    hooks = [
        blk.cross_attn.register_forward_hook(
            lambda mod, args, out, i=i: inputs.__setitem__(i, args)
        )
        for i, blk in enumerate(model.blocks)
    ]
    try:
        out = forward()
    finally:
        for h in hooks:
            h.remove()
    ref = []
    for i, blk in enumerate(model.blocks):
        attn, (h, context) = blk.cross_attn, inputs[i]
        B, H, Hkv, D = h.shape[0], attn.n_heads, attn.n_kv_heads, attn.head_dim
        q = attn.q_proj(h).view(B, -1, H, D).transpose(1, 2)  # (B, H, L, D)
        k, _ = attn.kv_proj(context).split(Hkv * D, dim=-1)
        k = k.view(B, -1, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        ref.append((q @ k.transpose(-1, -2) / D**0.5).softmax(-1))  # (B, H, L, N)
    return out, ref


def test_captured_cross_attention_equals_the_softmax_recomputed_from_q_and_k():
    m = tiny("transformer", n_layers=2, n_heads=4, n_kv_heads=2)  # grouped-query attention
    x, t = torch.rand(2, 3, 32, 32), tokens(2, 5)
    (logits, weights), ref = recomputed_cross_attention(m, lambda: m(x, t, need_weights=True))
    torch.testing.assert_close(logits, m(x, t))  # the same forward, weights aside
    for w, r in zip(weights, ref, strict=True):
        torch.testing.assert_close(w, r, atol=1e-5, rtol=1e-5)


def test_word_attention_is_the_last_layer_head_mean_per_predicted_word():
    m = tiny("transformer", n_layers=2)
    image, words = torch.rand(1, 3, 32, 32), [5, 9, 12]
    t = torch.tensor([[Vocab.START, *words]])
    maps = m.word_attention(image, t)[0]  # <start> predicts words[0], ..., words[-1] -> <end>
    assert maps.shape == (len(words) + 1, 8, 8) and maps.min() >= 0
    torch.testing.assert_close(maps.sum((1, 2)), torch.ones(len(words) + 1))
    _, weights = m(image, t, need_weights=True)
    torch.testing.assert_close(maps.flatten(1), weights[-1][0].mean(0))
    # causal: the map for word t does not depend on the words after it
    other = m.word_attention(image, torch.tensor([[Vocab.START, 5, 9, 30]]))[0]
    torch.testing.assert_close(other[:3], maps[:3])


def test_decoding_keeps_each_words_attention_map_as_teacher_forcing_gives_it():
    """The alignment kept while decoding (beam search's step_attention, with the KV caches) is
    the teacher-forced word attention of the caption it produced."""
    m = tiny("transformer", n_layers=2)
    x = torch.rand(2, 3, 32, 32)
    for beam in (1, 3):
        hyps = decode_captions(m, x, beam_size=beam, attention=True, max_len=8)
        for b, h in enumerate(hyps):
            t = torch.tensor([[Vocab.START, *h.ids]])
            ref = m.word_attention(x[b : b + 1], t)[0, : len(h.ids)]
            assert h.alignment.shape == (len(h.ids), 8, 8)
            torch.testing.assert_close(h.alignment, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no attention"):
        decode_captions(tiny("lstm"), x, attention=True)


@pytest.mark.parametrize(
    "arch,encoder,features",
    [
        ("lstm", "cnn", "penultimate"),
        ("lstm", "vit", "logits"),
        ("transformer", "cnn", "penultimate"),
        ("transformer", "vit", "penultimate"),
    ],
)
def test_every_trainable_parameter_gets_a_gradient(arch, encoder, features):
    """Parameters the caption never depends on are frozen (DDP needs all others used)."""
    m = tiny(arch, encoder=encoder, features=features).train()
    m(torch.rand(2, 3, 32, 32), tokens(2)).logsumexp(-1).sum().backward()
    missing = [
        k
        for k, p in m.named_parameters()
        if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)
    ]
    assert not missing
    assert any(p.requires_grad for p in m.encoder.parameters())


def test_captions_depend_on_the_image():
    for arch in ("lstm", "transformer"):
        m = tiny(arch)
        t = tokens(1).expand(2, -1)
        out = m(torch.stack([torch.zeros(3, 32, 32), torch.ones(3, 32, 32)]), t)
        assert not torch.allclose(out[0], out[1])


BLOCK_OPTIONS = [
    {},
    dict(position="rope", n_kv_heads=1, qk_norm="rmsnorm", ffn="swiglu", norm="rmsnorm"),
    dict(position="alibi", n_heads=4, n_kv_heads=2),
    dict(position="sinusoidal", norm_position="post"),
    dict(ffn="moe", n_experts=4, top_k=2, activation="silu"),
    dict(position="none", backend="math"),
]


@pytest.mark.parametrize(
    "arch,options", [("lstm", {})] + [("transformer", o) for o in BLOCK_OPTIONS]
)
def test_cached_decode_steps_equal_teacher_forcing(arch, options):
    """decode_step with the KV caches (self-attention over the words so far, cross-attention
    over the image tokens) gives the logits of the full teacher-forced forward: a two-token
    chunk first, then one token per step."""
    m = tiny(arch, n_layers=2, **options)
    x, t = torch.rand(2, 3, 32, 32), tokens(2, 7)
    with torch.no_grad():
        full = m(x, t)
        state = m.start_decoding(x, max_len=7)
        logits, state = m.decode_step(t[:, :2], state)
        torch.testing.assert_close(logits, full[:, 1], atol=1e-5, rtol=1e-5)
        for i in range(2, t.shape[1]):
            logits, state = m.decode_step(t[:, i : i + 1], state)
            torch.testing.assert_close(logits, full[:, i], atol=1e-5, rtol=1e-5)
    if arch == "transformer":
        assert state.memory is None and state.caches[0].length == 7
        assert state.cross_caches[0].length == 64
        with pytest.raises(ValueError, match="longer than max_len"):
            m.decode_step(t[:, :1], state)


@pytest.mark.parametrize("options", BLOCK_OPTIONS[1:])
def test_block_options_train(options):
    """Every block field reaches the captioner's blocks; the MoE aux loss reaches the task loss."""
    m = tiny("transformer", **options).train()
    task = CaptionTask(n_train=8, n_val=4, n_unseen=4)
    loss, metrics = task.loss(m, task.get_batch("train", 0, 4), SimpleNamespace())
    loss.backward()
    assert torch.isfinite(loss) and ("aux" in metrics) == (options.get("ffn") == "moe")
    blk = m.blocks[0]
    assert blk.attn.n_kv_heads == m.config.n_kv_heads
    assert type(blk.ffn).__name__ == {"swiglu": "SwiGLU", "moe": "MoE"}.get(m.config.ffn, "MLP")


def _exhaustive_best(m, x, vocab_size, n_out, alpha):
    """Every caption of at most ``n_out`` tokens (ending with <end>, or cut at n_out), scored by
    teacher forcing the way beam search scores them; the best per image."""
    allowed = [w for w in range(vocab_size) if w not in BANNED]
    seqs = [list(s) for n in range(1, n_out + 1) for s in itertools.product(allowed, repeat=n)]
    seqs = [s for s in seqs if Vocab.END not in s[:-1] and (s[-1] == Vocab.END or len(s) == n_out)]
    best = []
    for b in range(x.shape[0]):
        scored = []
        for s in seqs:
            t = torch.tensor([[Vocab.START, *s]])
            with torch.no_grad():
                logits = m(x[b : b + 1], t[:, :-1])[0].float()  # (len(s), V)
            logits[:, list(BANNED)] = float("-inf")
            logp = float(logits.log_softmax(-1).gather(-1, t[0, 1:, None]).sum())
            scored.append((logp / float(length_penalty(len(s), alpha)), logp, s))
        scored.sort(key=lambda r: r[0], reverse=True)
        best.append(scored[:2])
    return best, len(seqs)


@pytest.mark.parametrize("arch", ["lstm", "transformer"])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_as_wide_as_the_search_space_is_exhaustive_search(arch, alpha):
    """Four generable words (<unk>, <end> and two more), captions of up to 2 tokens: 13 in all.
    A beam of 13 keeps every one of them, so it must return the caption exhaustive search finds,
    with the same score."""
    vocab_size, max_len = 6, 3  # <start> + 2 output tokens
    torch.manual_seed(0)
    m = build_captioner(
        CaptionConfig.preset("tiny", arch=arch, vocab_size=vocab_size, max_len=max_len)
    ).eval()
    with torch.no_grad():
        m.head.weight.mul_(20)  # spread the logits: no near-ties between captions
    x = torch.rand(3, 3, 32, 32)
    best, n = _exhaustive_best(m, x, vocab_size, max_len - 1, alpha)
    assert n == 13
    hyps = decode_captions(m, x, beam_size=n, alpha=alpha)
    for h, ((score, logp, seq), (second, _, _)) in zip(hyps, best):
        assert score - second > 1e-4  # a unique best
        assert h.ids == seq
        assert h.score == pytest.approx(score, abs=1e-4)
        assert h.logprob == pytest.approx(logp, abs=1e-4)


class TableModel(torch.nn.Module):
    """A 'captioner' whose next-word distribution depends only on the previous word."""

    @dataclass
    class State(DecodeState):
        pass

    def __init__(self, table):
        super().__init__()
        self.logp = torch.log(torch.tensor(table))
        self.config = SimpleNamespace(max_len=5)
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def start_decoding(self, images, max_len=None):
        return self.State()

    def decode_step(self, tokens, state):
        return self.logp[tokens[:, -1]], state


def test_beam_search_finds_the_best_caption_greedy_misses():
    # words: 0 pad, 1 unk, 2 start, 3 end, 4 "a", 5 "b". After <start>: a 0.55, b 0.45.
    # After a: anything 1/4 (flat); after b: <end> 0.95. Greedy takes a; beam finds "b".
    eps = 1e-6
    table = [[0.25] * 6 for _ in range(6)]
    table[2] = [eps, eps, eps, eps, 0.55, 0.45]
    table[4] = [eps, eps, eps, 0.25, 0.375, 0.375]
    table[5] = [eps, eps, eps, 0.95, 0.025, 0.025]
    table = [[p / sum(r) for p in r] for r in table]
    m = TableModel(table)
    x = torch.zeros(2, 3, 1, 1)
    assert decode_captions(m, x)[0].ids[0] == 4
    best = [h.ids for h in decode_captions(m, x, beam_size=2, alpha=0.0)]
    assert best == [[5, Vocab.END]] * 2


def test_decoding_runs_past_the_full_stop_until_end():
    """'.' separates sentences inside a caption; only <end> stops greedy and beam decoding."""
    vocab = build_vocab()
    dot, two = vocab.stoi["."], vocab.stoi["two"]
    eps = 1e-6
    table = [[eps] * len(vocab) for _ in range(len(vocab))]
    table[Vocab.START][dot] = 1.0  # <start> -> "." -> "two" -> <end>
    table[dot][two] = 1.0
    table[two][Vocab.END] = 1.0
    table = [[p / sum(r) for p in r] for r in table]
    m = TableModel(table)
    x = torch.zeros(1, 3, 1, 1)
    for beam in (1, 2):
        assert [h.ids for h in decode_captions(m, x, beam_size=beam)] == [[dot, two, Vocab.END]]
    assert vocab.decode([Vocab.START, dot, two, Vocab.END]) == ". two"


def test_beam_search_with_real_model_returns_valid_captions():
    m = tiny("transformer")
    hyps = decode_captions(m, torch.rand(2, 3, 32, 32), beam_size=3)
    assert len(hyps) == 2
    for h in hyps:
        assert len(h.ids) <= m.config.max_len - 1 and Vocab.START not in h.ids
        assert Vocab.END not in h.ids[:-1]


def test_frozen_encoder_keeps_weights_and_batchnorm_statistics():
    m = build_captioner(
        CaptionConfig.preset("tiny", arch="lstm", vocab_size=V, freeze_encoder=True)
    )
    m.train()
    before = {k: v.clone() for k, v in m.encoder.state_dict().items()}
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    t = tokens(4)
    loss = m(torch.rand(4, 3, 32, 32), t).logsumexp(-1).mean()
    loss.backward()
    opt.step()
    assert all(torch.equal(before[k], v) for k, v in m.encoder.state_dict().items())
    assert not m.encoder.net.training and m.head.weight.grad is not None


def test_logit_features_feed_the_classifier_scores():
    m = tiny("lstm", features="logits", num_classes=3)
    assert m.init_h.in_features == 3
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(m.image_vector(x), m.encoder.logits(x))
    assert tiny("lstm").init_h.in_features == m.encoder.feature_dim


def test_config_checks_presets_and_first_release_keys():
    with pytest.raises(ValueError, match="arch"):
        CaptionConfig(arch="gru")
    with pytest.raises(ValueError, match="n_heads"):
        CaptionConfig(d_model=60, n_heads=8)
    with pytest.raises(ValueError, match="known"):
        CaptionConfig.preset("huge")
    with pytest.raises(ValueError, match="arch='lstm'"):
        CaptionConfig(arch="transformer", features="logits")
    c = CaptionConfig.preset("small", arch="lstm")
    assert CaptionConfig.from_dict(c.to_dict()) == c
    assert isinstance(build_captioner(c), LSTMCaptioner)
    assert CaptionConfig.presets() == ["small", "tiny"]
    # the first release's model section: the block fields it lacks get its model's values
    first = dict(arch="transformer", vocab_size=59, d_model=48, n_heads=2, dropout=0.0)
    c = CaptionConfig.from_dict(first)
    assert (c.ffn, c.ffn_hidden, c.activation, c.position) == ("mlp", 96, "gelu", "learned")
    assert isinstance(build_captioner(c), TransformerCaptioner)


def test_wrong_image_size_is_a_clear_error():
    with pytest.raises(UserError, match="32, 32"):
        tiny("transformer")(torch.rand(1, 3, 48, 48), tokens(1))


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,steps,margin",
    [
        # (object, colour, shape) margins, below the smallest gaps seeds 0-2 gave:
        # lstm 0.15, 0.19, 0.06; transformer 0.34, 0.51, 0.13
        ("lstm", 300, (0.1, 0.15, 0.03)),
        ("transformer", 200, (0.25, 0.3, 0.08)),
    ],
)
def test_short_training_names_objects_in_the_image(tmp_path, arch, steps, margin):
    """A short run through the shared trainer: the objects, colours and shapes the captions
    name are in *their* image more often than in the other scenes (the same captions scored
    against the others: what a captioner with these word habits gets without looking). A
    uniformly random colour-shape pair would be too weak a chance level: the data favour some
    colours, so naming the common pairs blindly already beats it by half."""
    task = CaptionTask(n_train=1500, n_val=100, n_unseen=50)
    vocab = task.vocab
    torch.manual_seed(0)
    model = build_captioner(CaptionConfig.preset("tiny", arch=arch, vocab_size=len(vocab)))
    cfg = TrainConfig(
        steps=steps,
        batch_size=48,
        lr=3e-3,
        warmup_steps=20,
        weight_decay=0.0,
        eval_every=steps,
        eval_batches=2,
        progress=False,
        device="cpu",
    )
    result = train(model, task, cfg, tmp_path / "run")
    assert result.steps == steps
    loaded, vocab2 = load(tmp_path / "run")
    assert vocab2.itos == vocab.itos
    m = caption_metrics(loaded, vocab2, task.sets("val"), range(100))
    m.pop("captions")
    assert m["other_object_precision"] > 1.5 * m["chance_precision"], m  # the prior is real
    for what, gap in zip(("object", "colour", "shape"), margin):
        assert m[f"{what}_precision"] > m[f"other_{what}_precision"] + gap, (what, m)
    assert m["bleu"] > 20
    x = images_to_tensor(task.sets("val").images[:2])
    assert all(h.ids for h in decode_captions(loaded, x))  # the loaded model decodes


def test_caption_metrics_on_known_captions(monkeypatch):
    """Reference listings of unseen scenes name their held-out combination and were never
    training captions; a fixed caption names none."""
    cfg = SceneConfig()
    train_caps = SceneSet(cfg, "train", 300).caption_set()
    unseen = SceneSet(cfg, "unseen", 40, seed=5)
    model = tiny("lstm")
    listing = iter([unseen.captions[i][0] for i in range(40)])
    monkeypatch.setattr(
        cap, "caption_images", lambda m, x, v, beam_size=1: [next(listing) for _ in range(len(x))]
    )
    m = caption_metrics(model, build_vocab(), unseen, range(40), train_captions=train_caps)
    assert m["novel_combo"] == 1.0 and m["object_precision"] == 1.0 and m["exact_match"] == 1.0
    assert m["retrieved"] == 0.0 and m["bleu"] > 99
    assert m["colour_precision"] == m["shape_precision"] == 1.0
    assert m["other_object_precision"] < 0.5 and m["other_colour_precision"] < 0.9
    fixed = "a yellow circle left of a blue square"
    assert fixed in train_caps
    monkeypatch.setattr(cap, "caption_images", lambda m, x, v, beam_size=1: [fixed] * len(x))
    m = caption_metrics(model, build_vocab(), unseen, range(40), train_captions=train_caps)
    assert m["novel_combo"] == 0.0 and m["retrieved"] == 1.0
    present = sum(
        (c in {(o.colour, o.shape) for o in s.objects})
        for s in unseen.scenes
        for c in (("yellow", "circle"), ("blue", "square"))
    )
    assert m["object_precision"] == pytest.approx(present / 80)
    # a caption that ignores the image scores the same against every other scene
    assert m["other_object_precision"] == pytest.approx(m["object_precision"])
    assert m["other_colour_precision"] == pytest.approx(m["colour_precision"])


def test_nearest_neighbour_baseline_retrieves_the_closest_training_caption():
    """Queried with the training scenes themselves, the pixel-space neighbour of each scene is
    itself; scored, its captions are verbatim training captions that name only present objects."""
    train = SceneSet(SceneConfig(), "train", 50, seed=2)
    hyps = nearest_neighbour_captions(train, train, range(50))
    assert hyps == [caps[0] for caps in train.captions]
    m = score_captions(hyps, train, range(50), train_captions=train.caption_set())
    assert m["retrieved"] == m["exact_match"] == m["object_precision"] == 1.0
    with pytest.raises(ValueError, match="one caption per scene"):
        score_captions(hyps[:3], train, range(50))
