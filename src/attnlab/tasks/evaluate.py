"""``attnlab eval RUN``: a loaded run scored on its held-out split, one function per family.

Each evaluator checks its options, calls ``load()`` for the run (a
:class:`attnlab.runs.LoadedRun`: model, tokenizer or vocabulary, kind, config; loading is the
caller's, a layer above this one) and returns the report's lines; :data:`EVALUATORS` maps the
family name (``lm``, ``mlm``, ``image``, ``caption``, ``vqa``, ``clip``, ``translate``,
``t5-span``) to its
evaluator.

    lines = EVALUATORS["lm"](lambda: attnlab.load(run_dir), batch_size=32, max_batches=None)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnlab.errors import RunDirError, UserError
from attnlab.tasks.caption import CaptionTask
from attnlab.tasks.clip import ClipTask
from attnlab.tasks.image import ImageClassificationTask
from attnlab.tasks.lm import LMTask
from attnlab.tasks.lm_xl import XLTask
from attnlab.tasks.mlm import MLMTask
from attnlab.tasks.t5_span import SpanCorruptionTask
from attnlab.tasks.translation import evaluate_heldout
from attnlab.tasks.vqa import VQATask

__all__ = ["EVALUATORS", "require_tokenizer"]

#: ``load()`` -> the run to evaluate
Loader = Callable[[], Any]


def require_tokenizer(run: Any) -> Any:
    """``run`` itself, refused when it holds no tokenizer (text cannot become tokens).

    Raises:
        RunDirError: a run converted from a Hugging Face folder without a tokenizer.json.
    """
    if run.tokenizer is None:
        raise RunDirError(
            f"{str(run.run_dir)!r} has no tokenizer.json, so text cannot be turned into tokens (a "
            "run converted from a Hugging Face folder without one); copy the checkpoint's "
            "tokenizer.json into it"
        )
    return run


def evaluate_lm(load: Loader, *, batch_size: int, max_batches: int | None) -> list[str]:
    """Loss and perplexity of a language model on the whole validation split (or N batches)."""
    if batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {batch_size}")
    if max_batches is not None and max_batches < 1:
        raise UserError(f"--max-batches must be >= 1, got {max_batches}")
    run = require_tokenizer(load())
    if run.task.get("type") != "lm":
        raise RunDirError(
            f"{str(run.run_dir)!r}: config.json has no language-modelling task, so there is no "
            "held-out split to evaluate (a run converted from a Hugging Face folder that attnlab "
            "did not export)"
        )
    task = LMTask.from_config(run.task, run.tokenizer)
    if run.kind == "transformer_xl":  # (runspec.lm_xl.XL_KIND: contiguous streams, with memory)
        task = XLTask.from_lm(task)
    res = task.val_loss(run.model, batch_size=batch_size, n_batches=max_batches)
    what = "the whole validation split" if max_batches is None else f"{max_batches} batches"
    return [
        f"{run.run_dir}: val loss {res['loss']:.4f}, perplexity {res['perplexity']:.3f} "
        f"({res['tokens']:,} tokens of {task.data!r}: {what}; {run.checkpoint})"
    ]


def _masked_eval(load: Loader, batch_size: int, max_batches: int | None, kind: tuple) -> list[str]:
    """Loss and accuracy of the predicted tokens of an MLM or a span-corruption run: ``kind``
    is ``(task type, task class, the task's name, the tokens' name)``."""
    task_type, task_cls, what, tokens = kind
    if batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {batch_size}")
    run = load()
    if run.task.get("type") != task_type:
        raise RunDirError(f"{str(run.run_dir)!r}: config.json has no {what} task")
    task = task_cls.from_config(run.task, run.tokenizer)
    res = task.val_metrics(run.model, batch_size=batch_size, n_batches=max_batches)
    return [
        f"{run.run_dir}: val loss {res['loss']:.4f}, {tokens[0]}-token accuracy {res['acc']:.1%} "
        f"({res['predicted']:,} {tokens[1]} tokens of {task.data!r}, {run.weights} weights)"
    ]


def evaluate_mlm(load: Loader, *, batch_size: int, max_batches: int | None) -> list[str]:
    """Loss and masked-token accuracy of a masked-LM encoder on its validation split."""
    kind = ("mlm", MLMTask, "masked-LM", ("masked", "predicted"))
    return _masked_eval(load, batch_size, max_batches, kind)


def evaluate_span(load: Loader, *, batch_size: int, max_batches: int | None) -> list[str]:
    """Loss and target-token accuracy of a T5 span-corruption run on its validation split."""
    kind = ("t5-span", SpanCorruptionTask, "span-corruption", ("target", "target"))
    return _masked_eval(load, batch_size, max_batches, kind)


def evaluate_image(load: Loader, *, batch_size: int, max_batches: int | None) -> list[str]:
    """Accuracy (overall and per class) and loss of an image classifier on its test split."""
    if batch_size < 1 or (max_batches is not None and max_batches < 1):
        raise UserError(
            f"--batch-size and --max-batches must be at least 1, got {batch_size} and {max_batches}"
        )
    run = load()
    task = ImageClassificationTask.for_run(run.task, run.tokenizer)
    res = task.evaluate_split(run.model, batch_size=batch_size, max_batches=max_batches)
    shown = [f"{n}: {a:.3f}" for n, a in zip(task.classes, res["per_class"]) if a is not None]
    return [
        f"{run.kind} on {task.data.name} test split: accuracy {res['accuracy']:.4f} "
        f"({res['correct']}/{res['n']}), loss {res['loss']:.4f}; {run.checkpoint}",
        "per class: " + ", ".join(shown),
    ]


def evaluate_caption(load: Loader, *, batch_size: int, max_batches: int | None) -> list[str]:
    """BLEU, object precision and retrieval of a captioner on the val and unseen scenes."""
    run = load()
    task = CaptionTask.for_run(run.task, run.run_dir)
    n = max_batches * batch_size if max_batches else 200
    return [
        f"{split}: BLEU {m['bleu']:.1f}, object precision {m['object_precision']:.1%} "
        f"(same captions on other scenes {m['other_object_precision']:.1%}, random pair "
        f"{m['chance_precision']:.1%}), verbatim training captions {m['retrieved']:.1%}"
        + (f", held-out combination named {m['novel_combo']:.1%}" if split == "unseen" else "")
        for split, m in task.evaluate_splits(run.model, run.tokenizer, n).items()
    ]


def evaluate_vqa(load: Loader, *, batch_size: int, max_batches: int | None) -> list[str]:
    """VQA accuracy per question type on the val and unseen scenes, and the answer-frequency
    baselines."""
    run = load()
    task = VQATask.for_run(run.task, run.run_dir)
    per_type = max(1, max_batches * batch_size // 7) if max_batches else 100
    res = task.evaluate_splits(run.model, per_type=per_type)
    lines = [
        f"{split}: accuracy {res[split]['all']:.1%} — "
        + ", ".join(f"{t} {v:.0%}" for t, v in res[split].items() if t != "all")
        for split in ("val", "unseen")
    ]
    baselines = ", ".join(f"majority {name} {acc:.1%}" for name, acc in res["baselines"].items())
    return [*lines, f"answer-frequency baselines (val): {baselines}"]


def evaluate_translation(load: Loader, *, batch_size: int, max_batches: int | None) -> list[str]:
    """Greedy exact match, BLEU and chrF of a translation model on its held-out pairs."""
    for flag, value in (("--batch-size", batch_size), ("--max-batches", max_batches)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    run = load()
    res = evaluate_heldout(
        run.model, run.tokenizer, run.run_dir, batch_size=batch_size, max_batches=max_batches
    )
    b = "n/a (targets shorter than 4 tokens)" if res["bleu"] is None else f"{res['bleu']:.2f}"
    return [
        f"held-out ({res['n']} sentences, greedy): exact match {res['exact_match']:.4f}, "
        f"BLEU {b}, chrF {res['chrf']:.2f}"
    ]


def evaluate_clip(load: Loader, *, batch_size: int, max_batches: int | None) -> list[str]:
    """Zero-shot accuracy by prompts and retrieval recall@1/5 of a dual encoder."""
    run = load()
    task = ClipTask.for_run(run.task, run.run_dir)
    lines = []
    for name, m in task.evaluate_splits(run.model).items():
        if name.startswith("zero-shot"):
            lines.append(f"{name}: accuracy {m['accuracy']:.1%} over {m['n']} single-object "
                         f"scenes (chance {m['chance']:.1%})")  # fmt: skip
        else:
            lines.append(f"{name}: " + ", ".join(
                f"recall@{k} image->text {m[f'i2t@{k}']:.1%}, text->image "
                f"{m[f't2i@{k}']:.1%} (chance {m[f'chance@{k}']:.1%})" for k in (1, 5)))  # fmt: skip
    return lines


#: family name -> evaluator(load, batch_size=, max_batches=) -> lines
EVALUATORS: dict[str, Callable[..., list[str]]] = {
    "lm": evaluate_lm,
    "mlm": evaluate_mlm,
    "image": evaluate_image,
    "caption": evaluate_caption,
    "vqa": evaluate_vqa,
    "clip": evaluate_clip,
    "translate": evaluate_translation,
    "t5-span": evaluate_span,
}
