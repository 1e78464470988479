"""Image captioning: a CNN + LSTM captioner and a patch-token + Transformer-decoder captioner.

CNN + LSTM (Show and Tell style, the lecture's pipeline): the image encoder's penultimate features
(or, for the experiment, its class logits) go through a linear layer into the LSTM's initial state
h₀, c₀; the decoder reads ``<start>`` and emits one word per step until ``<end>``:

    h₀, c₀ = tanh(W_h f), W_c f           f = image features (B, F)
    h_t = LSTM(h_{t-1}, E[w_{t-1}])       p(w_t | w_<t, image) = softmax(W_o h_t)

Transformer: the image becomes a set of tokens (a CNN's last feature map read as a grid, or ViT
patch tokens) with 2-D sin-cos positions; a causal Transformer decoder over the words
cross-attends to them, so every generated word has a map of where it looked:

    x = E[w] + P;  x = x + SelfAttn_causal(x);  x = x + CrossAttn(x, image tokens);  x = x + FFN(x)

Both models share the decoding interface (``init_state`` / ``step`` / ``reorder_state``) used by
:func:`greedy_decode` and :func:`beam_decode`. ``<end>`` (not the full stop) ends a caption.

Shape legend: B batch, L caption length, V vocabulary, N image tokens, C encoder width,
F feature vector width, D d_model, K beam size, H heads, Y decoder layers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.layers.block import build_block
from attnlab.layers.norm import make_norm
from attnlab.layers.position import LearnedPositionalEmbedding, sincos_2d
from attnlab.models.registry import register_kind

__all__ = [
    "CaptionConfig",
    "CAPTION_PRESETS",
    "build_image_encoder",
    "LSTMCaptioner",
    "TransformerCaptioner",
    "build_captioner",
    "greedy_decode",
    "beam_decode",
    "caption_images",
    "caption_metrics",
    "score_captions",
    "pretrain_encoder",
    "freeze_unused",
    "word_attention",
    "plot_word_attention",
]

ENCODERS = ("cnn", "vit")
ARCHS = ("lstm", "transformer")
FEATURES = ("penultimate", "logits")

CAPTION_PRESETS: dict[str, dict[str, Any]] = {
    # A few seconds of CPU per hundred steps on 32x32 scenes.
    "tiny": dict(encoder_width=16, encoder_depth=3, d_model=48, n_layers=1, n_heads=2),
    "small": dict(encoder_width=32, encoder_depth=3, d_model=128, n_layers=2, n_heads=4),
}


@dataclass
class CaptionConfig:
    """Hyper-parameters of both captioners.

    Attributes:
        arch: ``lstm`` (CNN features -> LSTM initial state) or ``transformer`` (cross-attention
            to image tokens).
        vocab_size: words including the special tokens.
        image_size: side of the square input image.
        encoder: ``cnn`` (:class:`~attnlab.models.vision.ResidualCNN`, grid tokens from the last
            feature map) or ``vit`` (:class:`~attnlab.models.vision.VisionTransformer` patch tokens).
        encoder_width: CNN channels of the last stage / ViT d_model.
        encoder_depth: CNN stages (each after the first halves the resolution) / ViT layers.
        patch_size: ViT patch size.
        num_classes: the encoder's classification head (pre-training as a shape classifier).
        features: what the LSTM captioner reads from the encoder: ``penultimate`` features or the
            classifier's ``logits`` (the lecture's FC4096-vs-FC1000 comparison).
        freeze_encoder: keep the encoder's weights (and batch-norm statistics) fixed.
        d_model: decoder width (LSTM hidden size / Transformer d_model).
        n_layers: LSTM layers / Transformer decoder blocks.
        n_heads: Transformer heads.
        max_len: longest caption in tokens, ``<start>`` and ``<end>`` included.
        dropout: dropout in the decoder.
    """

    arch: str = "transformer"
    vocab_size: int = 64
    image_size: int = 32
    encoder: str = "cnn"
    encoder_width: int = 32
    encoder_depth: int = 3
    patch_size: int = 4
    num_classes: int = 3
    features: str = "penultimate"
    freeze_encoder: bool = False
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 24
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; choose from {ARCHS}")
        if self.encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {self.encoder!r}; choose from {ENCODERS}")
        if self.features not in FEATURES:
            raise ValueError(f"unknown features {self.features!r}; choose from {FEATURES}")
        if self.features == "logits" and self.arch != "lstm":
            raise ValueError(
                f"features='logits' is for the LSTM captioner (arch='lstm'); arch={self.arch!r} "
                "reads the encoder's grid of image tokens"
            )
        if self.features == "logits" and self.num_classes < 1:
            raise ValueError(
                f"features='logits' needs an encoder head: num_classes >= 1, got {self.num_classes}"
            )
        for name in (
            "vocab_size",
            "image_size",
            "encoder_width",
            "encoder_depth",
            "d_model",
            "n_layers",
            "n_heads",
            "max_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"CaptionConfig.{name} must be positive, got {getattr(self, name)}"
                )
        if self.vocab_size < 5:
            raise ValueError(
                f"vocab_size={self.vocab_size} cannot hold the 4 special tokens + words"
            )
        if self.arch == "transformer" and self.d_model % 4:
            raise ValueError(f"d_model={self.d_model} must be divisible by 4 (2-D positions)")
        if self.arch == "transformer" and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptionConfig:
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> CaptionConfig:
        """A named size (``CAPTION_PRESETS``) with fields overridden."""
        if name not in CAPTION_PRESETS:
            raise ValueError(f"unknown caption preset {name!r}; known: {sorted(CAPTION_PRESETS)}")
        return cls(**{**CAPTION_PRESETS[name], **overrides})


def build_image_encoder(
    name: str, image_size: int, width: int, depth: int, *, patch_size: int = 4, num_classes: int = 0
) -> nn.Module:
    """The vision family's CNN or ViT, sized for small scenes.

    The returned module has ``features(images) -> (B, N, C)``, ``pooled_features(images) ->
    (B, C)``, ``feature_dim`` and ``forward(images) -> (B, num_classes)``.
    """
    if name == "cnn":
        from attnlab.models.vision import CNNConfig, ResidualCNN

        channels = [max(1, width // 2)] + [width] * (depth - 1)
        return ResidualCNN(
            CNNConfig(
                image_size=image_size,
                in_channels=3,
                num_classes=num_classes,
                channels=channels,
                blocks=[1] * depth,
            )
        )
    if name == "vit":
        from attnlab.models.vision import VisionTransformer, ViTConfig

        heads = 4 if width % 4 == 0 else 1
        return VisionTransformer(
            ViTConfig(
                image_size=image_size,
                patch_size=patch_size,
                in_channels=3,
                num_classes=num_classes,
                d_model=width,
                n_layers=depth,
                n_heads=heads,
                ffn_hidden=2 * width,
                pooling="mean",
                position="sincos",
            )
        )
    raise ValueError(f"unknown encoder {name!r}; choose from {ENCODERS}")


def freeze_unused(encoder: nn.Module, reads: str) -> None:
    """Stop gradients into encoder parts a model never reads (DDP requires every trainable
    parameter to take part in the loss).

    Args:
        encoder: from :func:`build_image_encoder`.
        reads: ``features`` (grid/patch tokens), ``pooled`` (penultimate vector) or ``logits``.
    """
    if reads == "logits":
        return
    if hasattr(encoder, "head"):
        encoder.head.requires_grad_(False)
    from attnlab.models.vision import ResidualCNN

    if reads == "features" and isinstance(encoder, ResidualCNN):
        encoder.norm.requires_grad_(False)  # only the pooled vector is normalised


class _Captioner(nn.Module):
    """What both captioners share: the image encoder, freezing, and the image-size check."""

    kind: ClassVar[str] = ""

    def __init__(self, config: CaptionConfig) -> None:
        super().__init__()
        self.config = c = config
        self.encoder = build_image_encoder(
            c.encoder,
            c.image_size,
            c.encoder_width,
            c.encoder_depth,
            patch_size=c.patch_size,
            num_classes=c.num_classes,
        )
        if c.freeze_encoder:
            self.encoder.requires_grad_(False)
        reads = (
            "features"
            if c.arch == "transformer"
            else ("logits" if c.features == "logits" else "pooled")
        )
        freeze_unused(self.encoder, reads)

    def train(self, mode: bool = True) -> _Captioner:
        super().train(mode)
        if self.config.freeze_encoder:  # frozen means frozen batch-norm statistics too
            self.encoder.eval()
        return self

    def check_images(self, images: Tensor) -> None:
        s = self.config.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (3, s, s):
            raise UserError(f"captioner expects images (B, 3, {s}, {s}), got {tuple(images.shape)}")

    def check_tokens(self, tokens: Tensor) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, L), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.config.max_len:
            raise ValueError(
                f"caption of {tokens.shape[1]} tokens is longer than max_len={self.config.max_len}"
            )

    # decoding interface (see greedy_decode): state is a tuple of tensors with batch first
    def init_state(self, images: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def step(self, state: tuple[Tensor, ...], prefix: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Next-word logits ``(N, V)`` given the words so far ``prefix (N, t)``."""
        raise NotImplementedError

    @staticmethod
    def reorder_state(state: tuple[Tensor, ...], index: Tensor) -> tuple[Tensor, ...]:
        return tuple(s.index_select(0, index) for s in state)


class LSTMCaptioner(_Captioner):
    """CNN features -> LSTM initial state -> one word per step (see the module docstring)."""

    kind: ClassVar[str] = "caption_lstm"

    def __init__(self, config: CaptionConfig) -> None:
        super().__init__(config)
        c = config
        f = c.num_classes if c.features == "logits" else self.encoder.feature_dim
        self.init_h = nn.Linear(f, c.n_layers * c.d_model)
        self.init_c = nn.Linear(f, c.n_layers * c.d_model)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.lstm = nn.LSTM(
            c.d_model,
            c.d_model,
            num_layers=c.n_layers,
            batch_first=True,
            dropout=c.dropout if c.n_layers > 1 else 0.0,
        )
        self.drop = nn.Dropout(c.dropout)
        self.head = nn.Linear(c.d_model, c.vocab_size)

    def image_vector(self, images: Tensor) -> Tensor:
        """``(B, F)``: penultimate features or class logits, as configured."""
        self.check_images(images)
        if self.config.features == "logits":
            return self.encoder(images)  # (B, num_classes)
        return self.encoder.pooled_features(images)  # (B, C)

    def init_state(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """``(h₀, c₀)``, each ``(B, Y, D)`` (batch first, so beams can be reordered)."""
        f = self.image_vector(images)
        B, Y, D = f.shape[0], self.config.n_layers, self.config.d_model
        h = torch.tanh(self.init_h(f)).view(B, Y, D)  # (B, Y, D)
        c = self.init_c(f).view(B, Y, D)  # (B, Y, D)
        return h, c

    def _run(self, tokens: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple]:
        h, c = (s.transpose(0, 1).contiguous() for s in state)  # (Y, B, D)
        out, (h, c) = self.lstm(self.drop(self.tok_emb(tokens)), (h, c))  # out (B, L, D)
        return self.head(self.drop(out)), (h.transpose(0, 1), c.transpose(0, 1))

    def forward(self, images: Tensor, tokens: Tensor) -> Tensor:
        """Teacher-forced logits ``(B, L, V)`` for ``tokens (B, L)`` starting with ``<start>``."""
        self.check_tokens(tokens)
        return self._run(tokens, self.init_state(images))[0]

    def step(self, state, prefix):
        logits, state = self._run(prefix[:, -1:], state)  # one new word: the LSTM carries the rest
        return logits[:, -1], state


class TransformerCaptioner(_Captioner):
    """Image tokens + causal Transformer decoder with cross-attention (module docstring)."""

    kind: ClassVar[str] = "caption_transformer"

    def __init__(self, config: CaptionConfig) -> None:
        super().__init__(config)
        c = config
        self.img_proj = nn.Linear(self.encoder.feature_dim, c.d_model)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositionalEmbedding(c.max_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            build_block(
                c.d_model,
                c.n_heads,
                ffn="mlp",
                ffn_hidden=2 * c.d_model,
                activation="gelu",
                norm="layernorm",
                norm_position="pre",
                dropout=c.dropout,
                cross_attention=True,
                context_dim=c.d_model,
            )
            for _ in range(c.n_layers)
        )
        self.norm_f = make_norm("layernorm", c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size)
        self.cross_weights: list[Tensor] = []

    def image_tokens(self, images: Tensor) -> Tensor:
        """Projected image tokens with 2-D positions, ``(B, N, D)``."""
        self.check_images(images)
        feats = self.encoder.features(images)  # (B, N, C)
        n = feats.shape[1]
        g = math.isqrt(n)
        pos = sincos_2d(g, n // g, self.config.d_model).to(feats)  # (N, D)
        return self.img_proj(feats) + pos

    def decode(self, memory: Tensor, tokens: Tensor, *, need_weights: bool = False) -> Tensor:
        """Logits ``(B, L, V)`` of ``tokens (B, L)`` given image tokens ``memory (B, N, D)``."""
        self.check_tokens(tokens)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(positions))  # (B, L, D)
        weights = []
        for blk in self.blocks:
            x = blk(x, is_causal=True, context=memory, need_weights=need_weights)
            if need_weights:
                weights.append(blk.cross_weights)  # (B, H, L, N)
        self.cross_weights = weights
        return self.head(self.norm_f(x))

    def forward(self, images: Tensor, tokens: Tensor, *, need_weights: bool = False) -> Tensor:
        """Teacher-forced logits ``(B, L, V)``; ``need_weights`` keeps ``cross_weights``."""
        return self.decode(self.image_tokens(images), tokens, need_weights=need_weights)

    @torch.no_grad()
    def cross_attention_maps(self, images: Tensor, tokens: Tensor) -> Tensor:
        """Cross-attention of each word over the image tokens, ``(Y, B, H, L, N)``.

        Row ``t`` is what the decoder looked at while predicting word ``t + 1`` from ``tokens[:,
        :t+1]``; each row sums to 1 over the N image tokens.
        """
        self.forward(images, tokens, need_weights=True)
        return torch.stack(self.cross_weights)

    def init_state(self, images):
        return (self.image_tokens(images),)

    def step(self, state, prefix):
        # Captions are short (< 25 tokens): recomputing the prefix keeps decoding simple.
        return self.decode(state[0], prefix)[:, -1], state


def build_captioner(config: CaptionConfig) -> _Captioner:
    """The captioner named by ``config.arch``."""
    return LSTMCaptioner(config) if config.arch == "lstm" else TransformerCaptioner(config)


register_kind(
    LSTMCaptioner.kind,
    CaptionConfig,
    LSTMCaptioner,
    artifacts="scene_vocab",
)
register_kind(
    TransformerCaptioner.kind,
    CaptionConfig,
    TransformerCaptioner,
    artifacts="scene_vocab",
)


def _load_vocab(run_dir):
    from attnlab.data.scenes import Vocab

    return Vocab.load(run_dir / "vocab.json")


# ----------------------------------------------------------------------------------------------
# decoding

START, END = 2, 3  # attnlab.data.scenes.Vocab.START / END


@torch.no_grad()
def greedy_decode(model: _Captioner, images: Tensor, max_len: int | None = None) -> list[list[int]]:
    """The most likely word at each step, until ``<end>`` or ``max_len`` tokens.

    Returns:
        One list of word ids per image, without ``<start>`` and ``<end>``.
    """
    max_len = min(max_len or model.config.max_len, model.config.max_len)
    B = images.shape[0]
    state = model.init_state(images)
    seq = torch.full((B, 1), START, dtype=torch.long, device=images.device)  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=images.device)
    for _ in range(max_len - 1):
        logits, state = model.step(state, seq)
        nxt = logits.argmax(-1).masked_fill(done, END)  # (B,)
        seq = torch.cat((seq, nxt[:, None]), dim=1)
        done |= nxt == END
        if bool(done.all()):
            break
    return [_strip(row) for row in seq.tolist()]


def _strip(ids: list[int]) -> list[int]:
    out = []
    for i in ids[1:]:
        if i == END:
            break
        out.append(i)
    return out


@torch.no_grad()
def beam_decode(
    model: _Captioner,
    images: Tensor,
    beam_size: int = 3,
    max_len: int | None = None,
    length_penalty: float = 0.7,
) -> list[list[int]]:
    """Beam search: keep the ``beam_size`` best prefixes by total log-probability.

    A hypothesis ends at ``<end>``; finished ones are ranked by ``log p / len^length_penalty`` so
    that longer captions are not penalised merely for having more factors.

    Returns:
        The best caption per image (word ids, no ``<start>``/``<end>``).
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    max_len = min(max_len or model.config.max_len, model.config.max_len)
    B, K, dev = images.shape[0], beam_size, images.device
    state = model.init_state(images)
    state = model.reorder_state(state, torch.arange(B, device=dev).repeat_interleave(K))  # B·K
    seq = torch.full((B * K, 1), START, dtype=torch.long, device=dev)  # (B·K, 1)
    scores = torch.full((B, K), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: keep one alive
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for t in range(1, max_len):
        logits, state = model.step(state, seq)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B·K, V)
        V = logp.shape[-1]
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)  # (B, K·V)
        top, idx = cand.topk(2 * K, dim=-1)  # room for beams that end now
        new_scores = torch.full((B, K), float("-inf"), device=dev)
        src = torch.zeros(B, K, dtype=torch.long, device=dev)
        words = torch.full((B, K), END, dtype=torch.long, device=dev)
        for b in range(B):
            k = 0
            for s, j in zip(top[b].tolist(), idx[b].tolist()):
                beam, word = divmod(j, V)
                if s == float("-inf"):
                    break
                if word == END or t == max_len - 1:
                    ids = seq[b * K + beam, 1:].tolist() + ([] if word == END else [word])
                    finished[b].append((s / max(1, len(ids) + 1) ** length_penalty, ids))
                    continue
                if k < K:
                    new_scores[b, k], src[b, k], words[b, k] = s, beam, word
                    k += 1
            if k == 0:
                new_scores[b] = float("-inf")
        flat = (torch.arange(B, device=dev)[:, None] * K + src).view(-1)  # (B·K,)
        state = model.reorder_state(state, flat)
        seq = torch.cat((seq.index_select(0, flat), words.view(-1, 1)), dim=1)
        scores = new_scores
        # Stop once no open beam is likely to beat the best finished one (the usual heuristic:
        # its current normalised score; with a length penalty this is not a guarantee).
        best_open = scores.max(-1).values
        if all(
            finished[b]
            and best_open[b].item() / (t + 1) ** length_penalty < max(f[0] for f in finished[b])
            for b in range(B)
        ):
            break
    return [max(f)[1] if f else [] for f in finished]


def caption_images(model: _Captioner, images: Tensor, vocab, *, beam_size: int = 1) -> list[str]:
    """Captions as text for ``images (B, 3, H, W)`` (greedy when ``beam_size == 1``)."""
    was_training = model.training
    model.eval()
    try:
        ids = (
            greedy_decode(model, images)
            if beam_size == 1
            else beam_decode(model, images, beam_size)
        )
    finally:
        model.train(was_training)
    return [vocab.decode(i) for i in ids]


def caption_metrics(
    model: _Captioner,
    vocab,
    sset,
    indices: Iterable[int],
    *,
    beam_size: int = 1,
    train_captions: set[str] | None = None,
    batch_size: int = 128,
) -> dict:
    """Decode captions for scenes ``indices`` of a :class:`~attnlab.data.scenes.SceneSet` and
    score them with :func:`score_captions`."""
    from attnlab.data.scenes import images_to_tensor

    indices = list(indices)
    if not indices:
        raise ValueError("caption_metrics needs at least one scene")
    device = next(model.parameters()).device
    hyps: list[str] = []
    for b in range(0, len(indices), batch_size):
        idx = indices[b : b + batch_size]
        imgs = images_to_tensor(sset.images[idx]).to(device)
        hyps += caption_images(model, imgs, vocab, beam_size=beam_size)
    return score_captions(hyps, sset, indices, train_captions=train_captions)


def score_captions(
    hyps: list[str], sset, indices: Iterable[int], *, train_captions: set[str] | None = None
) -> dict:
    """Score captions ``hyps`` of scenes ``indices`` of a :class:`~attnlab.data.scenes.SceneSet`.

    Returns a dict with
        ``bleu``: corpus BLEU (sacrebleu) against all reference captions of each scene;
        ``object_precision``: fraction of named (colour, shape) objects present in the scene;
        ``colour_precision`` / ``shape_precision``: the same for the colour / shape word alone;
        ``chance_precision``: object precision of a caption naming a uniformly random combination;
        ``other_object_precision`` / ``other_colour_precision`` / ``other_shape_precision``: the
            same captions scored against the *other* scenes' objects (each caption against every
            other scene, averaged) — what a captioner with the same word habits would score if
            it ignored the image, so the gap to the ``*_precision`` above is what it read there;
        ``exact_match``: fraction of captions equal to one of the scene's own references;
        ``retrieved``: fraction that appear verbatim in ``train_captions`` (when given);
        ``novel_combo``: fraction of scenes where a held-out combination present in the scene
            is named correctly (meaningful on the ``unseen`` split);
        ``captions``: the generated text.
    """
    import sacrebleu

    from attnlab.data.scenes import mentioned_objects

    indices = list(indices)
    if not indices or len(hyps) != len(indices):
        raise ValueError(f"need one caption per scene, got {len(hyps)} for {len(indices)} scenes")
    refs = [sset.captions[i] for i in indices]
    n_refs = max(len(r) for r in refs)
    ref_streams = [[r[k] if k < len(r) else r[0] for r in refs] for k in range(n_refs)]
    bleu = sacrebleu.corpus_bleu(hyps, ref_streams).score
    held = set(sset.config.heldout_combos())
    n_combos = len(sset.config.colours) * len(sset.config.shapes)
    present = [{(o.colour, o.shape) for o in sset.scenes[i].objects} for i in indices]
    scenes = [(p, {c for c, _ in p}, {s for _, s in p}) for p in present]
    mentioned = [mentioned_objects(h) for h in hyps]
    named = sum(map(len, mentioned))

    def hits(m: list[tuple[str, str]], scene: tuple[set, set, set]) -> list[int]:
        """How many of the objects named in ``m``, their colours and their shapes ``scene``
        (its objects, colours, shapes) holds."""
        objs, colours, shapes = scene
        return [
            sum(cs in objs for cs in m),
            sum(c in colours for c, _ in m),
            sum(s in shapes for _, s in m),
        ]

    n = len(indices)
    own, other = [0.0] * 3, [0.0] * 3
    for k, m in enumerate(mentioned):
        own = [a + b for a, b in zip(own, hits(m, scenes[k]))]
        if m and n > 1:  # this caption against each of the other scenes, averaged
            h = [hits(m, scenes[j]) for j in range(n) if j != k]
            other = [a + sum(col) / (n - 1) for a, col in zip(other, zip(*h))]
    own = [x / named if named else 0.0 for x in own]
    other = [x / named if named else 0.0 for x in other] if n > 1 else [float("nan")] * 3
    chance = sum(len(p) / n_combos for p in present)
    novel_hit = novel_total = 0
    for p, m in zip(present, mentioned):
        if p & held:
            novel_total += 1
            novel_hit += bool(set(m) & p & held)
    out = {
        "bleu": bleu,
        "object_precision": own[0],
        "colour_precision": own[1],
        "shape_precision": own[2],
        "chance_precision": chance / n,
        "other_object_precision": other[0],
        "other_colour_precision": other[1],
        "other_shape_precision": other[2],
        "exact_match": sum(h in set(r) for h, r in zip(hyps, refs)) / len(hyps),
        "novel_combo": novel_hit / novel_total if novel_total else float("nan"),
        "captions": hyps,
    }
    if train_captions is not None:
        out["retrieved"] = sum(h in train_captions for h in hyps) / len(hyps)
    return out


# ----------------------------------------------------------------------------------------------
# encoder pre-training (the "ImageNet classifier" of the lecture, at toy scale)


def pretrain_encoder(
    encoder: nn.Module, sset, steps: int, *, batch_size: int = 64, lr: float = 2e-3, seed: int = 0
) -> float:
    """Train ``encoder`` as a classifier of :func:`~attnlab.data.scenes.shape_label` (the majority
    shape) on the scenes of ``sset``; returns the accuracy on the last 20 % of the scenes
    (held out from this training).

    The point is a classifier whose logits know "which class" and little else; the captioning
    experiment then reads either those logits or the penultimate features.
    """
    import numpy as np
    import torch.nn.functional as F

    from attnlab.data.scenes import images_to_tensor, shape_label

    labels = torch.tensor([shape_label(s) for s in sset.scenes])
    n_fit = max(1, int(0.8 * len(sset)))
    rng = np.random.default_rng(seed)
    device = next(encoder.parameters()).device
    trainable = {n: p.requires_grad for n, p in encoder.named_parameters()}
    encoder.requires_grad_(True)  # the classifier head too, even if the captioner won't read it
    opt = torch.optim.AdamW(encoder.parameters(), lr=lr, weight_decay=0.0)
    encoder.train()
    for _ in range(steps):
        idx = rng.integers(n_fit, size=batch_size)
        x = images_to_tensor(sset.images[idx]).to(device)
        loss = F.cross_entropy(encoder(x), labels[idx].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for n, p in encoder.named_parameters():
        p.requires_grad_(trainable[n])
    encoder.eval()
    with torch.no_grad():
        idx = np.arange(n_fit, len(sset)) if n_fit < len(sset) else np.arange(len(sset))
        pred = encoder(images_to_tensor(sset.images[idx]).to(device)).argmax(-1).cpu()
    return float((pred == labels[idx]).float().mean())


# ----------------------------------------------------------------------------------------------
# per-word attention maps


@torch.no_grad()
def word_attention(
    model: TransformerCaptioner, image: Tensor, word_ids: list[int], *, layer: int = -1
) -> Tensor:
    """Where the decoder looked for each word of a caption, ``(n_words + 1, gh, gw)``.

    Row ``t`` is the head-averaged cross-attention of ``layer`` while predicting word ``t``
    (the last row predicts ``<end>``), reshaped to the image-token grid.
    """
    if not isinstance(model, TransformerCaptioner):
        raise UserError(
            "attention maps need the Transformer captioner (the LSTM one has no "
            "attention over the image)"
        )
    tokens = torch.tensor([[START] + list(word_ids)], device=image.device)  # (1, L)
    maps = model.cross_attention_maps(image[None] if image.dim() == 3 else image, tokens)
    m = maps[layer, 0].mean(0)  # (L, N)
    g = math.isqrt(m.shape[-1])
    return m.view(m.shape[0], g, m.shape[-1] // g)  # (L, gh, gw)


def plot_word_attention(image, words: list[str], maps: Tensor, path) -> None:
    """Save a figure: the image, then one panel per word with its attention map overlaid.

    Args:
        image: ``uint8 (H, W, 3)`` array.
        words: the caption's words (``<end>`` is appended as the last panel's label).
        maps: ``(len(words) + 1, gh, gw)`` from :func:`word_attention`.
        path: PNG to write (atomically).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.runs import atomic_save

    labels = list(words) + ["<end>"]
    n = len(labels) + 1
    cols = min(n, 6)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2 * cols, 2.1 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    axes.flat[0].imshow(image)
    axes.flat[0].set_title("image", fontsize=9)
    h, w = image.shape[:2]
    for i, label in enumerate(labels):
        ax = axes.flat[i + 1]
        ax.imshow(image)
        ax.imshow(
            maps[i].cpu().numpy(),
            cmap="magma",
            alpha=0.6,
            extent=(0, w, h, 0),
            interpolation="nearest",
        )
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
    plt.close(fig)
