"""attnlab.train: the training loop every model family shares.

``train(model, task, TrainConfig(...), run_dir)`` runs AdamW (no decay on norms, biases,
embeddings; or Muon for the hidden matrices, ``optimizer="muon"``) with warm-up + cosine / inverse-sqrt / constant learning rate, gradient accumulation,
global-norm clipping, optional bf16 autocast and ``torch.compile``, periodic validation, best and
last checkpoints, exact ``resume``, and data parallelism under ``torchrun``. A model family
provides a :class:`Task` (batches, loss, validation set).
"""

from attnlab.tasks.base import Task, to_device
from attnlab.tasks.losses import cross_entropy
from attnlab.train.checkpoint import RunWriteError, check_run_dir
from attnlab.train.cli_args import add_train_args, train_config_from_args
from attnlab.train.config import TrainConfig
from attnlab.train.optim import LRSchedule, make_optimizer, param_groups
from attnlab.train.trainer import Terminated, TrainingDiverged, TrainResult, train

__all__ = [
    "TrainConfig",
    "train",
    "check_run_dir",
    "TrainResult",
    "TrainingDiverged",
    "Terminated",
    "RunWriteError",
    "add_train_args",
    "train_config_from_args",
    "cross_entropy",
    "Task",
    "to_device",
    "param_groups",
    "make_optimizer",
    "LRSchedule",
]
