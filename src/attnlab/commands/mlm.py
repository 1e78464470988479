"""Encoder-only commands: ``attnlab train mlm``, ``attnlab fill-mask``, ``attnlab eval`` (encoder
runs) and ``attnlab experiment bidirectional``.

    attnlab train mlm --preset tiny --max-time 120 --out runs/mlm
    attnlab fill-mask runs/mlm "def f[MASK]nction(x):" --top-k 5
    attnlab experiment bidirectional --max-time 300 --out runs/bidirectional

The CLI only parses and prints; the work is done by :mod:`attnlab.tasks.mlm` (masking, loss,
``fill_mask``), :mod:`attnlab.models.encoder`, :mod:`attnlab.train` and
:mod:`attnlab.experiments.bidirectional`. Settings merge as for every ``attnlab train KIND``
(:mod:`attnlab.commands.config_args`): defaults < ``--config FILE`` < typed flags < ``--set``; the
model section starts from a preset (``tiny`` unless one is named), its vocabulary size comes from
the tokenizer (plus the four specials) and its ``max_seq_len`` is ``task.seq_len``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from attnlab.commands.flags import add_flags, at_least_one
from attnlab.errors import RunDirError, UserError

KIND = "encoder_mlm"
#: task settings with their own flag (dest -> task field)
TASK_FLAGS = ("data", "tokenizer", "vocab_size", "seq_len", "max_chars", "mask_prob")
MODEL_FLAGS = {"preset": "model.preset", "backend": "model.backend"}
_N_SPECIALS = 4


def _settings(args: argparse.Namespace, base: dict[str, Any] | None) -> tuple[dict, Any, Any]:
    """``(model fields without vocab_size, TrainConfig, MLMTaskConfig)`` of ``train mlm``.

    Raises:
        UserError: a config of another kind, ``vocab_size`` set by hand, disagreeing
            ``seq_len`` / ``max_seq_len``, an unknown preset; ConfigError for bad values.
    """
    from attnlab.commands.config_args import explicit_dests, resolve_sections
    from attnlab.commands.lm_settings import _file_model, _preset_fields
    from attnlab.config import EncoderConfig, MLMTaskConfig
    from attnlab.config.overrides import parse_overrides
    from attnlab.config.train import TrainConfig

    base = dict(base or {})
    if base.get("kind", KIND) != KIND:
        raise UserError(f"the config's kind {base['kind']!r} is not a masked-LM encoder ({KIND})")
    file_model = dict(base.get("model") or {})
    task_base = base.get("task") if isinstance(base.get("task"), dict) else {}
    if file_model.get("vocab_size") == (task_base.get("vocab_size") or 0) + _N_SPECIALS:
        del file_model["vocab_size"]  # a run's config.json: the tokenizer's, recomputed
    file_model = _file_model({"model": file_model, "task": task_base}, EncoderConfig)
    keys = {name: f"train.{name}" for name in TrainConfig.field_names()}
    keys.update({dest: f"task.{dest}" for dest in TASK_FLAGS})
    keys.update(MODEL_FLAGS)
    sections = resolve_sections(args, keys, base={k: v for k, v in base.items() if k != "model"})
    cli_model = dict(sections["model"])
    cli_preset, file_preset = cli_model.pop("preset", None), file_model.pop("preset", None)
    if file_preset is None and cli_preset is None:
        file_preset = "tiny"
    if "vocab_size" in {**file_model, **cli_model}:
        raise UserError(
            "the vocabulary size comes from the tokenizer: use --vocab-size (BPE), "
            "not --set vocab_size"
        )
    model = {
        **_preset_fields(EncoderConfig, file_preset),
        **file_model,
        **_preset_fields(EncoderConfig, cli_preset),
        **cli_model,
    }
    task = dict(sections["task"])
    given_len = {**file_model, **cli_model}.get("max_seq_len")
    if given_len is not None and task.get("seq_len", given_len) != given_len:
        raise UserError(
            f"--seq-len {task['seq_len']} and --set max_seq_len={given_len} disagree "
            "(task.seq_len and model.max_seq_len are the same thing: give one)"
        )
    task.setdefault("seq_len", model.get("max_seq_len", EncoderConfig().max_seq_len))
    model["max_seq_len"] = task["seq_len"]
    train = TrainConfig.from_dict(sections["train"])
    set_seed = "task.seed" in parse_overrides(getattr(args, "set", None) or [])
    if task.get("seed") is None or ("seed" in explicit_dests(args) and not set_seed):
        task["seed"] = train.seed
    return model, train, MLMTaskConfig.from_dict(task)


def _train_mlm(args: argparse.Namespace) -> int:
    import torch

    from attnlab.commands.config_args import resumed_config
    from attnlab.config import EncoderConfig
    from attnlab.config.overrides import load_config_file
    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.models.registry import build_model
    from attnlab.tasks.mlm import MLMTask
    from attnlab.train import train
    from attnlab.train.distributed import resolve_device
    from attnlab.train.stopping import completion

    out = Path(args.out)
    saved = resumed_config(args, (KIND,), "mlm", "masked-LM")  # before reading the corpus
    if saved is not None:
        _, train_cfg, _ = _settings(args, saved)
        done = completion(out, train_cfg)
        if done:  # before the corpus is read
            print(done)
            return 0
        resolve_device(train_cfg.device)  # a bad --device: one line, before the corpus
        task = MLMTask.from_config(saved["task"], load_tokenizer(out))
        model = build_model(KIND, saved["model"])
    else:
        model_fields, train_cfg, task_cfg = _settings(
            args, load_config_file(args.config) if args.config else None
        )
        EncoderConfig.from_dict({**model_fields, "vocab_size": 256})  # fail before the corpus
        resolve_device(train_cfg.device)
        task = MLMTask.build(task_cfg)
        torch.manual_seed(train_cfg.seed)
        model = build_model(KIND, {**model_fields, "vocab_size": task.vocab_size})
    main_rank = int(os.environ.get("RANK", "0")) == 0
    if main_rank:
        print(
            f"model {KIND}: {model.num_parameters() / 1e6:.2f}M parameters; data {task.data!r}: "
            f"{task.n_tokens['train']:,} training tokens ({task.tokenizer.type} tokenizer, "
            f"vocab {task.vocab_size} with [PAD] [CLS] [SEP] [MASK])",
            file=sys.stderr,
        )
    result = train(model, task, train_cfg, out, resume=args.resume, overwrite=args.overwrite)
    if main_rank:
        last = next((r for r in reversed(result.history) if "val_acc" in r), {})
        acc = f", masked accuracy {last['val_acc']:.1%}" if last.get("val_acc") is not None else ""
        val = "n/a" if result.val_loss is None else f"{result.val_loss:.4f}"
        print(
            f"{result.steps} steps in {result.elapsed:.1f} s: val loss {val}{acc}; run saved in "
            f"{result.run_dir}"
        )
    return 0


def _load_encoder(run_dir: str, weights: str, device: str) -> Any:
    from attnlab.runs import load
    from attnlab.train.distributed import resolve_device

    return load(run_dir, weights=weights, map_location=str(resolve_device(device)), kinds=(KIND,))


def _fill_mask(args: argparse.Namespace) -> int:
    from attnlab.tasks.mlm import check_masked_text, fill_mask

    at_least_one(args, "top_k")
    check_masked_text(args.text)  # before loading the run
    loaded = _load_encoder(args.run_dir, args.weights, args.device)
    for pred in fill_mask(loaded.model, loaded.tokenizer, args.text, top_k=args.top_k):
        cands = "  ".join(f"{tok!r} {p:.3f}" for tok, p in pred.candidates)
        print(f"[MASK] {pred.index + 1} (token {pred.position}): {cands}")
    return 0


def _eval_mlm(args: argparse.Namespace) -> int:
    from attnlab.tasks.mlm import MLMTask

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    loaded = _load_encoder(args.run_dir, args.weights, getattr(args, "device", None) or "cpu")
    if loaded.task.get("type") != "mlm":
        raise RunDirError(f"{str(args.run_dir)!r}: config.json has no masked-LM task")
    task = MLMTask.from_config(loaded.task, loaded.tokenizer)
    res = task.val_metrics(loaded.model, batch_size=args.batch_size, n_batches=args.max_batches)
    print(
        f"{args.run_dir}: val loss {res['loss']:.4f}, masked-token accuracy {res['acc']:.1%} "
        f"({res['predicted']:,} predicted tokens of {task.data!r}, {args.weights} weights)"
    )
    return 0


def _bidirectional(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import from_args
    from attnlab.experiments.bidirectional import BidirectionalConfig, run_bidirectional

    cfg = from_args(BidirectionalConfig, args, progress=not args.no_progress)
    report = run_bidirectional(cfg, args.out, overwrite=args.overwrite)
    print(report["table"])
    for name, path in report["files"].items():
        print(f"{name}: {path}")
    return 0


# ----------------------------------------------------------------------------------------------
# parsers


def _add_train_parser(groups) -> None:
    from attnlab.commands.config_args import add_config_args, track_explicit
    from attnlab.config import EncoderConfig
    from attnlab.train import add_train_args

    p = groups["train"].add_parser(
        "mlm",
        help="train a BERT-style encoder by masked language modelling on a text corpus",
        description="Masked-LM training (BERT): 15%% of the tokens of each [CLS] ... [SEP] "
        "window are chosen, 80/10/10 replaced by [MASK] / a random token / kept, and predicted "
        "from both sides. Examples: 'attnlab train mlm --preset tiny --max-time 120 --out "
        "runs/mlm'; 'attnlab train mlm --config runs/mlm/config.json --set d_model=128 --out "
        "runs/wider'.",
    )
    # fmt: off
    add_flags(p, [
        ("--data", None, None,
         "'pydoc' (default), 'stdlib' or a path to a text file or folder", {"metavar": "CORPUS"}),
        ("--preset", None, None,
         f"size/style preset (default tiny): {', '.join(EncoderConfig.presets())}"),
        ("--tokenizer", ["char", "bpe"], None, "char (default) or bpe"),
        ("--vocab-size", int, None, "BPE vocabulary size before the specials"),
        ("--seq-len", int, None,
         "tokens per example, [CLS] and [SEP] included = the model's context"),
        ("--max-chars", int, None, "use only the first N characters"),
        ("--mask-prob", float, None, "fraction of tokens predicted (0.15)"),
        ("--backend", None, None, "attention backend (auto, sdpa, math, ...)"),
    ])
    # fmt: on
    add_train_args(p, out="runs/mlm", steps=1000, lr=1e-3, warmup_steps=100)
    add_config_args(p)
    track_explicit(p)
    p.set_defaults(func=_train_mlm)


def _add_fill_mask_parser(groups) -> None:
    p = groups["top"].add_parser(
        "fill-mask",
        help="predict the [MASK] tokens of a text with a masked-LM run",
        description="Print, for every [MASK] in the text, the most probable tokens and their "
        "probabilities under an encoder trained with 'attnlab train mlm'.",
    )
    # fmt: off
    add_flags(p, [
        ("run_dir", None, None, "run directory written by 'attnlab train mlm'"),
        ("text", None, None, 'text with one or more [MASK], e.g. "def f[MASK]nction"'),
        ("--top-k", int, 5, "candidates per mask (default 5)"),
        ("--weights", ["best", "last"], "best", "checkpoint (default best)"),
        ("--device", None, "cpu", "cpu (default), cuda or auto"),
    ])
    # fmt: on
    p.set_defaults(func=_fill_mask)


def _add_experiment_parser(groups) -> None:
    e = groups["experiment"].add_parser(
        "bidirectional",
        help="masked characters inside words: an encoder (both sides) vs a causal LM (left side)",
        description="Train an MLM encoder and a decoder-only LM of equal size for the same "
        "number of steps on the same corpus, then predict the same held-out characters inside "
        "words: the encoder sees the word's both sides, the LM only its left side. Writes "
        "table.md, results.json and bidirectional.png.",
    )
    # fmt: off
    add_flags(e, [
        ("--out", None, "runs/bidirectional", "output directory"),
        ("--max-time", float, 300.0, "seconds for both models together (300)"),
        ("--steps", int, None, "train each model N steps instead"),
        ("--data", None, "pydoc", "corpus (default pydoc)"),
        ("--max-chars", int, None, "first N characters only"),
        ("--seq-len", int, 32, "context of both models (32)"),
        ("--d-model", int, 64, "width of both models (64)"),
        ("--n-layers", int, 2, "blocks of both models (2)"),
        ("--n-heads", int, 4, "heads of both models (4)"),
        ("--batch-size", int, 32, "examples per step (32)"),
        ("--mask-prob", float, 0.15, "encoder's masking rate (BERT: 0.15)"),
        ("--n-eval", int, 2000, "held-out characters scored (2000)"),
        ("--device", None, "auto", "auto (default), cpu or cuda"),
        ("--seed", int, 0, None),
        ("--threads", int, None, "CPU threads (default torch's; 1 on a busy machine)"),
        ("--overwrite", "store_true", None, "replace the results in --out"),
        ("--no-progress", "store_true", None, "no progress bars"),
    ])
    # fmt: on
    e.set_defaults(func=_bidirectional)


def register(groups) -> None:
    """Add ``train mlm``, ``fill-mask``, ``experiment bidirectional`` and the encoder evaluator."""
    from attnlab.commands import register_evaluator

    _add_train_parser(groups)
    _add_fill_mask_parser(groups)
    _add_experiment_parser(groups)
    register_evaluator(KIND, _eval_mlm)
