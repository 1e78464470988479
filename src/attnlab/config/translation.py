"""Configs of the translation family: the Transformer encoder–decoder, the RNN encoder–decoders,
and the translation task's data settings, with their presets.

    Seq2SeqConfig.preset("tiny", src_vocab_size=32, tgt_vocab_size=181)
    RNNSeq2SeqConfig.preset("small", cell="lstm")
    TranslationTaskConfig(task="numbers", lang="de", high=999)
    TranslationTaskConfig(scheduled_sampling={"decay": "inverse_sigmoid", "k": 300})
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from attnlab.config.base import Activation, BlockConfig, Config, ConfigError, NormPosition

__all__ = [
    "Seq2SeqConfig",
    "RNNSeq2SeqConfig",
    "TranslationTaskConfig",
    "ScheduledSamplingConfig",
    "SEQ2SEQ_PRESETS",
    "RNN_PRESETS",
    "TRANSLATION_TASKS",
    "VOCAB_LEVELS",
    "number_languages",
    "check_number_language",
]


def _stacks(n_layers: int, **sizes: Any) -> dict[str, Any]:
    """A preset with ``n_layers`` blocks in each stack (the paper's models are symmetric)."""
    return dict(n_enc_layers=n_layers, n_dec_layers=n_layers, **sizes)


#: Seq2SeqConfig presets: ``vaswani`` / ``vaswani-big`` are the paper's base and big models (its
#: post-norm, sinusoidal, ReLU defaults), ``small`` trains in CPU minutes, ``tiny`` in seconds.
SEQ2SEQ_PRESETS: dict[str, dict[str, Any]] = {
    "vaswani": _stacks(6, d_model=512, n_heads=8, ffn_hidden=2048, dropout=0.1, max_seq_len=256),
    "vaswani-big": _stacks(
        6, d_model=1024, n_heads=16, ffn_hidden=4096, dropout=0.3, max_seq_len=256
    ),
    "small": _stacks(3, d_model=128, n_heads=4, ffn_hidden=512, dropout=0.1, max_seq_len=128),
    "tiny": _stacks(2, d_model=64, n_heads=4, ffn_hidden=128, dropout=0.0, max_seq_len=64),
}

#: RNNSeq2SeqConfig presets (both ``rnn`` and ``rnn-attn``)
RNN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(emb_dim=32, hidden=64, n_layers=1),
    "small": dict(emb_dim=64, hidden=128, n_layers=1),
    "base": dict(emb_dim=256, hidden=512, n_layers=2, dropout=0.2),
}

Seq2SeqPosition = Literal["sinusoidal", "learned", "rope", "alibi", "none"]
#: the fields that hold one stack's own block config
_STACKS = ("encoder", "decoder")


@dataclass
class Seq2SeqConfig(BlockConfig):
    """The Transformer encoder–decoder (Vaswani et al. 2017): the block fields plus its own.

    Defaults are the paper's base model: post-norm, sinusoidal positions, ReLU FFN of width
    4·d_model, dropout 0.1, embeddings scaled by √d_model and the target embedding tied to the
    output projection. Every block field (GQA, RoPE/ALiBi, QK-norm, SwiGLU, MoE, drop-path,
    backends) applies to both stacks, unless a stack has its own block config: ``encoder`` and
    ``decoder`` (a :class:`BlockConfig` each; given as a mapping, the fields it leaves out are
    the shared ones: ``--set model.decoder.ffn=swiglu``). The residual width and the position
    scheme are shared by both stacks (one embedding width, one position module).

    Attributes:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (set from the data).
        n_enc_layers, n_dec_layers: stack depths N (6 and 6 in the paper).
        final_norm: a norm after each stack. Pre-norm needs it (forced on); the paper's post-norm
            model has none, ``torch.nn.Transformer`` has one (``True`` reproduces it).
        max_seq_len: longest source/target (position tables and KV caches).
        scale_embeddings: multiply embeddings by √d_model (paper §3.4).
        tie_embeddings: share the target embedding with the output projection (paper §3.4).
        pad_id: padding id of both vocabularies.
        position: ``sinusoidal`` (paper) | ``learned`` | ``rope`` | ``alibi`` | ``none``.
        encoder, decoder: the block config of one stack (None: the shared block fields).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = SEQ2SEQ_PRESETS

    d_model: int = 512
    n_heads: int = 8
    activation: Activation = "relu"
    norm_position: NormPosition = "post"
    position: Seq2SeqPosition = "sinusoidal"
    dropout: float = 0.1
    src_vocab_size: int = 1000
    tgt_vocab_size: int = 1000
    n_enc_layers: int = 6
    n_dec_layers: int = 6
    final_norm: bool = False
    max_seq_len: int = 256
    scale_embeddings: bool = True
    tie_embeddings: bool = True
    pad_id: int = 0
    encoder: BlockConfig | None = None
    decoder: BlockConfig | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Seq2SeqConfig:
        """Read a model section; a stack's block given as a mapping starts from the shared
        block fields."""
        if isinstance(d, Mapping) and any(isinstance(d.get(k), Mapping) for k in _STACKS):
            shared = super().from_dict({k: v for k, v in d.items() if k not in _STACKS})
            d = dict(d)
            for name in _STACKS:
                if isinstance(d.get(name), Mapping):
                    fields = dict(d[name])
                    derived = [k for k in ("n_kv_heads", "head_dim", "ffn_hidden") if k in fields]
                    base = shared.block_fields()
                    if set(fields) - set(derived) & {"n_heads", "d_model", "ffn", "activation"}:
                        for k in ("n_kv_heads", "head_dim", "ffn_hidden"):
                            if k not in fields:  # derive again from the stack's own sizes
                                base[k] = None
                    d[name] = BlockConfig.from_dict({**base, **fields})
        return super().from_dict(d)

    def validate(self) -> None:
        super().validate()
        for name in _STACKS:
            block = getattr(self, name)
            if block is None:
                continue
            for shared in ("d_model", "position"):
                if getattr(block, shared) != getattr(self, shared):
                    raise ConfigError(
                        f"{name}.{shared}={getattr(block, shared)!r} differs from {shared}="
                        f"{getattr(self, shared)!r}: both stacks share the embeddings' width and "
                        "one position module"
                    )
        self.positive("src_vocab_size", "tgt_vocab_size", "max_seq_len")
        if self.n_enc_layers < 1 or self.n_dec_layers < 1:
            raise ConfigError(
                f"need at least one layer, got n_enc_layers={self.n_enc_layers}, "
                f"n_dec_layers={self.n_dec_layers}"
            )
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ConfigError(f"pad_id {self.pad_id} is outside the vocabularies")
        if "pre" in {b.norm_position for b in (self.encoder_block, self.decoder_block)}:
            self.final_norm = True  # without it the residual stream is never normalised

    @property
    def encoder_block(self) -> BlockConfig:
        """The block config of the encoder stack."""
        return self.encoder if self.encoder is not None else self.block

    @property
    def decoder_block(self) -> BlockConfig:
        """The block config of the decoder stack."""
        return self.decoder if self.decoder is not None else self.block


@dataclass
class RNNSeq2SeqConfig(Config):
    """The RNN encoder–decoders ``rnn`` (fixed context) and ``rnn-attn`` (Bahdanau attention).

    Attributes:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (set from the data).
        cell: ``gru`` | ``lstm`` | ``rnn`` (the vanilla cell h_t = tanh(W x_t + U h_{t-1} + b)),
            for the encoder and the decoder.
        emb_dim: token embedding width E (both sides).
        hidden: RNN state width per direction (the decoder state is ``hidden`` wide).
        n_layers: encoder layers (the decoder is one recurrent cell, stepped explicitly).
        bidirectional: bidirectional encoder (Bahdanau's choice).
        attn_dim: width of the additive-attention scoring layer (``rnn-attn``; default 2·hidden
            with a bidirectional encoder, else hidden; ``score="additive"`` only).
        score: the alignment score of ``rnn-attn`` (:class:`attnlab.attention.AdditiveAttention`):
            ``additive`` vᵀ tanh(W_s s + W_h h + b) (Bahdanau's), ``concat`` wᵀ [s; h] + b (one
            linear layer), ``dot`` sᵀ h (needs ``bidirectional=False``), ``general`` sᵀ W h.
        init_state: the decoder's first state s_0: ``projection`` tanh(W_b h_fin) (a learned
            projection of the encoder's final state), ``last`` the forward encoder state after the
            last real source token (as wide as s), ``zeros``. An LSTM's first cell is zeros.
        dropout: on embeddings and between encoder layers.
        pad_id: padding id.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = RNN_PRESETS

    src_vocab_size: int = 1000
    tgt_vocab_size: int = 1000
    cell: Literal["gru", "lstm", "rnn"] = "gru"
    emb_dim: int = 64
    hidden: int = 128
    n_layers: int = 1
    bidirectional: bool = True
    attn_dim: int | None = None
    dropout: float = 0.0
    pad_id: int = 0
    score: Literal["additive", "concat", "dot", "general"] = "additive"
    init_state: Literal["projection", "last", "zeros"] = "projection"

    def validate(self) -> None:
        super().validate()
        self.positive("src_vocab_size", "tgt_vocab_size", "emb_dim", "hidden", "n_layers")
        self.positive("attn_dim")
        self.fraction("dropout")
        if self.score == "dot" and self.enc_dim != self.hidden:
            raise ConfigError(
                f"score='dot' needs encoder states as wide as the decoder state ({self.hidden}), "
                f"but the bidirectional encoder's are {self.enc_dim}: set bidirectional=false or "
                "use score='general'"
            )
        if self.attn_dim is not None and self.score != "additive":
            raise ConfigError(f"attn_dim applies to score='additive' only, not {self.score!r}")

    @property
    def enc_dim(self) -> int:
        """Width of an encoder state: ``hidden`` per direction."""
        return self.hidden * (2 if self.bidirectional else 1)


#: default ``k`` of each decay (Bengio et al. 2015 give the forms, not the values): the gold
#: probability is one half after 500 steps (linear, with c = 1e-3), 693 (exponential) and 1711
#: (inverse sigmoid)
_DEFAULT_K = {"none": 1.0, "linear": 1.0, "exponential": 0.999, "inverse_sigmoid": 300.0}


@dataclass
class ScheduledSamplingConfig(Config):
    """Scheduled sampling (Bengio et al. 2015): how often training feeds the gold token.

    At training step i the decoder reads the gold previous token with probability ε_i and its own
    greedy prediction otherwise (teacher forcing is ε_i = 1 throughout). The forms of the paper:

        linear:           ε_i = max(min_gold, k - c·i)
        exponential:      ε_i = max(min_gold, k^i)               (k < 1)
        inverse_sigmoid:  ε_i = max(min_gold, k / (k + exp(i/k)))  (k >= 1)

    The schedule counts optimizer steps and nothing else: it does not stretch with the run's
    length (``--steps``/``--max-time``), so a run of the same steps sees the same ε_i. Validation
    loss stays teacher-forced.

    Attributes:
        decay: ``none`` (teacher forcing) | ``linear`` | ``exponential`` | ``inverse_sigmoid``.
        k: the decay's constant (see above; default per decay: 1, 0.999, 300).
        c: linear only: the slope per step.
        min_gold: floor ε of the gold-token probability.
        scheme: how a model is fed its own predictions: ``stepwise`` (each step reads the
            prediction made one step earlier in the same pass; what RNNs do), ``two_pass``
            (predictions of a teacher-forced pass without gradient, then a second pass on the
            mixed input; Mihaylova & Martins 2019, the Transformer's way) or ``auto`` (stepwise for
            recurrent decoders, two passes otherwise).
    """

    decay: Literal["none", "linear", "exponential", "inverse_sigmoid"] = "none"
    k: float | None = None
    c: float = 1e-3
    min_gold: float = 0.0
    scheme: Literal["auto", "stepwise", "two_pass"] = "auto"

    def validate(self) -> None:
        super().validate()
        k = self.decay_constant
        if self.decay == "exponential" and not 0 < k < 1:
            raise ConfigError(f"exponential decay needs 0 < k < 1, got k={k}")
        if self.decay == "inverse_sigmoid" and k < 1:
            raise ConfigError(f"inverse_sigmoid decay needs k >= 1, got k={k}")
        if self.decay == "linear" and not (k > 0 and self.c > 0):
            raise ConfigError(f"linear decay needs k > 0 and c > 0, got k={k}, c={self.c}")
        if not 0.0 <= self.min_gold <= 1.0:
            raise ConfigError(f"min_gold must be in [0, 1], got {self.min_gold}")

    @property
    def decay_constant(self) -> float:
        """``k``, or the decay's default when it is not set (kept unset in config.json, so that
        changing ``decay`` alone never inherits another decay's constant)."""
        return _DEFAULT_K[self.decay] if self.k is None else float(self.k)

    @property
    def active(self) -> bool:
        """True when training ever feeds the model its own predictions."""
        return self.decay != "none" and self.min_gold < 1.0

    def gold_probability(self, step: int) -> float:
        """ε_i: the probability of feeding the gold token at optimizer step ``step``."""
        k = self.decay_constant
        if self.decay == "none":
            return 1.0
        if self.decay == "linear":
            eps = k - self.c * step
        elif self.decay == "exponential":
            eps = k**step
        else:  # inverse sigmoid; exp overflows past ~709·k steps, where ε is 0 anyway
            z = step / k
            eps = k / (k + math.exp(z)) if z < 700 else 0.0
        return min(1.0, max(self.min_gold, eps))


TRANSLATION_TASKS = ("numbers", "dates", "tsv")
VOCAB_LEVELS = ("word", "char", "bpe")
Level = Literal["word", "char", "bpe"]
#: the vocabulary levels of each task when none is given: (source, target)
_DEFAULT_LEVELS = {"numbers": ("word", "bpe"), "dates": ("char", "char"), "tsv": ("word", "word")}


def number_languages() -> list[str]:
    """Target languages ``num2words`` can write (English is the source)."""
    # lazy: num2words imports ~60 modules (~0.15 s); only the number-pair corpora need it
    from num2words import CONVERTER_CLASSES

    return sorted(k for k in CONVERTER_CLASSES if k != "en")


def check_number_language(lang: str) -> None:
    """Raise :class:`ConfigError` unless ``num2words`` can write numbers in ``lang``."""
    langs = number_languages()
    if lang not in langs:
        raise ConfigError(
            f"unknown language {lang!r} for the numbers task; choose from "
            f"{', '.join(langs)} (e.g. it, fr, de)"
        )


@dataclass
class TranslationTaskConfig(Config):
    """Which pairs to generate or read, how to tokenise and split them (config.json's ``task``).

    Attributes:
        task: ``numbers`` | ``dates`` | ``tsv``.
        lang: numbers: target language (``it``, ``fr``, ``de``...; any ``num2words`` language).
        low, high: numbers: the range (controls source length).
        n_examples: numbers/dates: how many pairs to generate (numbers: at most the range size).
        path, src_col, tgt_col: tsv: the file and its columns.
        src_level, tgt_level: ``word`` | ``char`` | ``bpe``; ``None`` = the task's default
            (numbers word->bpe, dates char->char, tsv word->word).
        bpe_vocab_size: size of BPE vocabularies.
        min_freq: word/char vocabularies: rarer tokens become ``<unk>``.
        lowercase: lower-case both sides.
        max_len: drop pairs with more than this many tokens on either side.
        min_len: drop pairs with fewer tokens on either side.
        val_frac, test_frac: held-out fractions (disjoint from training).
        seed: generation and split seed.
        eval_examples: validation sentences greedily decoded at each validation (exact match,
            BLEU, chrF; 0 = loss only).
        scheduled_sampling: feed the decoder its own predictions during training
            (:class:`ScheduledSamplingConfig`; default: teacher forcing). Set from the command
            line with ``--set task.scheduled_sampling.decay=inverse_sigmoid``.

    config.json's ``task`` also records ``name`` and the data's ``stats``; they are read back and
    dropped (``IGNORED``).
    """

    IGNORED: ClassVar[frozenset[str]] = frozenset({"name", "stats"})

    task: Literal["numbers", "dates", "tsv"] = "numbers"
    lang: str = "it"
    low: int = 0
    high: int = 999_999
    n_examples: int = 20_000
    path: str | None = None
    src_col: int = 0
    tgt_col: int = 1
    src_level: Level | None = None
    tgt_level: Level | None = None
    bpe_vocab_size: int = 200
    min_freq: int = 1
    lowercase: bool = True
    max_len: int = 64
    min_len: int = 1
    val_frac: float = 0.05
    test_frac: float = 0.05
    seed: int = 0
    eval_examples: int = 200
    scheduled_sampling: ScheduledSamplingConfig = field(default_factory=ScheduledSamplingConfig)

    def validate(self) -> None:
        super().validate()
        if self.task == "numbers":
            check_number_language(self.lang)
        if self.task == "tsv" and not self.path:
            raise ConfigError("the tsv task needs a file: --data PATH")
        src_default, tgt_default = _DEFAULT_LEVELS[self.task]
        self.src_level = self.src_level or src_default
        self.tgt_level = self.tgt_level or tgt_default
        if not (
            0 <= self.val_frac < 1
            and 0 <= self.test_frac < 1
            and self.val_frac + self.test_frac < 1
        ):
            raise ConfigError(
                f"val_frac={self.val_frac}, test_frac={self.test_frac} must be in "
                "[0, 1) with a sum below 1"
            )
        if self.n_examples < 3:
            raise ConfigError(f"n_examples must be at least 3, got {self.n_examples}")
        if self.min_len < 1 or self.max_len < self.min_len:
            raise ConfigError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")
        self.positive("bpe_vocab_size", "min_freq")
        self.positive("src_col", "tgt_col", "eval_examples", allow_zero=True)

    @property
    def strip_hyphens(self) -> bool:
        """Numbers: "twenty-one" is "twenty one" and thousands commas are dropped."""
        return self.task == "numbers"
