"""``TrainConfig``: every knob of the shared training loop, as one serialisable dataclass.

It is stored as ``"train"`` in a run directory's ``config.json``. Defaults follow common practice
for small Transformers (nanoGPT / GPT-3 paper): AdamW with betas (0.9, 0.95), weight decay 0.1,
global-norm clipping at 1.0, linear warm-up then cosine decay to 10 % of the peak rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.config.base import Config, ConfigError

__all__ = ["TrainConfig", "SCHEDULES", "AMP_MODES", "STRATEGIES", "FSDP_DTYPES", "OPTIMIZERS"]

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "inverse_sqrt", "constant", "wsd")
AMP_MODES = ("none", "bf16")
STRATEGIES = ("ddp", "fsdp")
FSDP_DTYPES = ("float32", "bfloat16")


@dataclass
class TrainConfig(Config):
    """Settings of one training run.

    The length of a run is given by ``steps`` (optimizer steps) or ``max_time`` (wall-clock
    seconds). When both are set ``max_time`` wins and ``steps`` is ignored; with ``max_time`` the
    learning-rate schedule runs on ``elapsed / max_time`` so it ends exactly when the budget does.

    ``batch_size`` is the *global* batch of one optimizer step: it is split into ``grad_accum``
    micro-batches, and each micro-batch is split over the ``world`` data-parallel ranks, so it must
    be divisible by ``grad_accum * world``.

    Under ``torchrun`` the ranks either each hold the whole model (``strategy="ddp"``) or shard
    parameters, gradients and optimizer state over themselves (``strategy="fsdp"``, FSDP2: see
    :mod:`attnlab.train.fsdp`; checkpoints are then sharded, :mod:`attnlab.train.sharded`).
    The ``fsdp_*`` fields only matter with ``fsdp``.
    """

    steps: int | None = None  # optimizer steps (ignored when max_time is set)
    max_time: float | None = None  # wall-clock seconds; schedule progress = elapsed / max_time
    batch_size: int = 32  # GLOBAL examples per optimizer step (split over ranks and grad_accum)
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 3e-4  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine floor = lr * min_lr_ratio
    warmup_steps: int = 100  # linear warm-up length in optimizer steps
    warmup_frac: float | None = None  # warm-up as a fraction of the run; overrides warmup_steps
    schedule: Literal["cosine", "inverse_sqrt", "constant", "wsd"] = (
        "cosine"  # "cosine" | "inverse_sqrt" | "constant" | "wsd" (after warm-up)
    )
    # "wsd" (warm-up, stable, decay): the peak rate, then a linear cool-down to the floor over
    # this last fraction of the run after warm-up (modded-nanogpt's speedrun: about 0.4)
    cooldown_frac: float = 0.4
    weight_decay: float = 0.1  # AdamW decoupled decay; never on norms, biases, embeddings
    betas: tuple[float, float] = (0.9, 0.95)  # 0.95 rather than 0.999: steadier with large batches
    # "adamw" | "muon": torch.optim.Muon for the hidden 2-D weight matrices (not embeddings,
    # heads, norms, biases), AdamW with lr/betas/weight_decay for the rest (attnlab.train.muon)
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_lr: float = 0.02  # Muon's peak rate (the schedule scales it like lr)
    muon_momentum: float = 0.95  # Muon's Nesterov momentum
    muon_weight_decay: float = 0.0  # Muon's decoupled decay (W -= muon_lr * this * W)
    grad_clip: float | None = 1.0  # clip the global gradient norm to this (None: no clipping)
    label_smoothing: float = 0.0  # read by tasks in their loss (attnlab.train.cross_entropy)
    amp: Literal["none", "bf16"] = "none"  # "none" | "bf16" (torch.autocast)
    compile: bool = False  # torch.compile the model for training
    eval_every: int = 200  # steps between validations and checkpoints; also at the end
    eval_batches: int = 10  # validation batches per evaluation (0: no validation)
    log_every: int = 10  # steps between metrics.jsonl records / progress-bar updates
    seed: int = 0
    device: str = "auto"  # "auto" -> cuda if available else cpu; or "cpu", "cuda", "cuda:1"
    progress: bool = True  # tqdm progress bar on stderr (rank 0 only)
    strategy: Literal["ddp", "fsdp"] = "ddp"  # under torchrun: replicate (DDP) or shard (FSDP2)
    # FSDP compute dtype of the gathered parameters; "auto": bfloat16 with amp="bf16", else float32
    fsdp_param_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    fsdp_reduce_dtype: Literal["float32", "bfloat16"] = "float32"  # gradient reduce-scatter dtype
    # free each unit's gathered parameters after its forward (ZeRO-3); False keeps them for the
    # backward (more memory, one all-gather less per unit and step)
    fsdp_reshard_after_forward: bool = True

    def validate(self) -> None:
        super().validate()
        if self.steps is None and self.max_time is None:
            raise ConfigError("TrainConfig needs steps or max_time (both are None)")
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ConfigError(f"steps must be a positive integer, got {self.steps!r}")
        if self.max_time is not None and not self.max_time > 0:
            raise ConfigError(f"max_time must be > 0 seconds, got {self.max_time!r}")
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ConfigError(
                f"batch_size ({self.batch_size}) and grad_accum ({self.grad_accum}) must be >= 1"
            )
        if self.batch_size % self.grad_accum:
            raise ConfigError(
                f"batch_size ({self.batch_size}) must be divisible by grad_accum "
                f"({self.grad_accum})"
            )
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.warmup_frac is not None and not 0.0 <= self.warmup_frac < 1.0:
            raise ConfigError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not 0.0 < self.cooldown_frac <= 1.0:
            raise ConfigError(f"cooldown_frac must be in (0, 1], got {self.cooldown_frac}")
        if self.schedule == "inverse_sqrt" and (self.warmup or 0) < 1:
            raise ConfigError(
                "the inverse_sqrt schedule needs a warm-up of at least one step, "
                f"(warmup_steps={self.warmup_steps}, warmup_frac={self.warmup_frac})"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not self.muon_lr > 0 or not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigError(
                f"muon_lr must be > 0 and muon_momentum in [0, 1), got {self.muon_lr} and "
                f"{self.muon_momentum}"
            )
        if self.muon_weight_decay < 0:
            raise ConfigError(f"muon_weight_decay must be >= 0, got {self.muon_weight_decay}")
        if self.optimizer == "muon" and self.strategy == "fsdp":
            raise ConfigError(
                "optimizer='muon' does not work with strategy='fsdp' (Muon orthogonalises whole "
                "matrices; FSDP shards them): use strategy='ddp' or optimizer='adamw'"
            )
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigError(f"grad_clip must be > 0 or None, got {self.grad_clip}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.amp not in AMP_MODES:
            raise ConfigError(f"amp must be one of {AMP_MODES}, got {self.amp!r}")
        if self.eval_every < 1 or self.log_every < 1:
            raise ConfigError(
                f"eval_every ({self.eval_every}) and log_every ({self.log_every}) must be >= 1"
            )
        if self.eval_batches < 0:
            raise ConfigError(f"eval_batches must be >= 0, got {self.eval_batches}")

    @property
    def timed(self) -> bool:
        """True when the run length is a wall-clock budget (``max_time``)."""
        return self.max_time is not None

    @property
    def warmup(self) -> int | None:
        """Warm-up length in optimizer steps, or ``None`` when it is a fraction of a timed run.

        ``warmup_frac * steps`` when a fraction is set on a step-counted run, else ``warmup_steps``.
        """
        if self.warmup_frac is None:
            return self.warmup_steps
        if self.timed:
            return None
        return round(self.warmup_frac * self.steps)
