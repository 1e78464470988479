"""What ``attnlab train KIND`` says about a run: its model and data before training
(``*_start``) and its result after (``*_result``), one pair of functions per family.

Each returns the text; the command prints it. ``result`` is the trainer's
:class:`attnlab.train.TrainResult` (steps, elapsed, losses, history, run directory).
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

__all__ = [
    "n_params",
    "lm_start",
    "lm_result",
    "mlm_start",
    "mlm_result",
    "span_start",
    "span_result",
    "image_start",
    "image_result",
    "translate_result",
    "caption_result",
    "vqa_result",
    "clip_result",
]


def n_params(model: nn.Module) -> int:
    """Parameters of ``model``, a tied one (LM head = embedding) counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _loss(x: float | None, digits: int) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def lm_start(model: nn.Module, task: Any) -> str:
    """The model's size and the corpus: tokens, tokenizer, vocabulary, skipped files."""
    skipped = (task.prepared.manifest["skipped"] if task.prepared else {}).items()
    skipped_s = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in skipped if n)
    return (
        f"model {model.kind}: {n_params(model) / 1e6:.2f}M parameters; data {task.data!r}: "
        f"{task.n_tokens['train']:,} training tokens "
        f"({task.tokenizer.type} tokenizer, vocab {task.vocab_size})"
        + (f"; files skipped: {skipped_s}" if skipped_s else "")
    )


def lm_result(result: Any, eval_batches: int) -> str:
    """Steps, time, train and validation loss (with perplexity), where the run is."""
    val = result.val_loss
    ppl = f" (perplexity {math.exp(val):.2f})" if val is not None and val < 50 else ""
    batches = f"{eval_batches} validation batch{'' if eval_batches == 1 else 'es'}"
    return (
        f"{result.steps} steps in {result.elapsed:.1f} s: train loss "
        f"{_loss(result.final_train_loss, 4)}, val loss {_loss(val, 4)}{ppl} on {batches} "
        f"('attnlab eval' reads the whole split); run saved in {result.run_dir}"
    )


def mlm_start(model: nn.Module, task: Any) -> str:
    """The encoder's size and the corpus, the four special tokens included in the vocabulary."""
    return (
        f"model {model.kind}: {model.num_parameters() / 1e6:.2f}M parameters; data "
        f"{task.data!r}: {task.n_tokens['train']:,} training tokens ({task.tokenizer.type} "
        f"tokenizer, vocab {task.vocab_size} with [PAD] [CLS] [SEP] [MASK])"
    )


def mlm_result(result: Any, accuracy: str = "masked accuracy") -> str:
    """Steps, time, validation loss and the last accuracy measured (``accuracy``: its name)."""
    last = next((r for r in reversed(result.history) if "val_acc" in r), {})
    acc = f", {accuracy} {last['val_acc']:.1%}" if last.get("val_acc") is not None else ""
    return (
        f"{result.steps} steps in {result.elapsed:.1f} s: val loss {_loss(result.val_loss, 4)}"
        f"{acc}; run saved in {result.run_dir}"
    )


def span_start(model: nn.Module, task: Any) -> str:
    """The T5 model's size, the corpus, the specials and sentinels, how much is corrupted."""
    n, c = sum(p.numel() for p in model.parameters()), task.config
    return (
        f"model t5 ({n / 1e6:.2f}M parameters); data {task.data!r}: {task.n_tokens['train']:,} "
        f"training tokens, vocab {task.vocab_size} with <pad> </s> and {c.n_sentinels} "
        f"sentinels; {c.n_noise} of {c.seq_len} tokens corrupted in {c.n_spans} spans"
    )


def span_result(result: Any) -> str:
    """:func:`mlm_result` of a span-corruption run (the accuracy on the target tokens)."""
    return mlm_result(result, "target accuracy")


def image_start(kind: str, model: nn.Module, task: Any) -> str:
    """The classifier's size and the data: image shape, classes, training images."""
    return (
        f"{kind}: {sum(p.numel() for p in model.parameters()):,} parameters; {task.data.name} "
        f"{'×'.join(map(str, task.image_shape))}, {task.num_classes} classes, "
        f"{len(task.train_y)} training images (augment={task.augment})"
    )


def image_result(model: nn.Module, task: Any, result: Any) -> str:
    """Steps, time, final train loss and the validation accuracy, measured now."""
    device = next(model.parameters()).device
    acc, loss = task.test_accuracy(model, split="val", device=device)
    return (
        f"{result.steps} steps in {result.elapsed:.1f} s; final train loss "
        f"{result.final_train_loss:.4f}; val accuracy {acc:.3f} (loss {loss:.4f}); run saved to "
        f"{result.run_dir}\ntest it with: attnlab eval {result.run_dir}"
    )


def _trained(what: str, model: nn.Module, result: Any, keys: tuple[str, ...]) -> str:
    last = result.history[-1] if result.history else {}
    extra = "".join(f", {k} {last[k]:.3f}" for k in keys if k in last)
    return (
        f"trained {what} ({sum(p.numel() for p in model.parameters()):,} parameters) for "
        f"{result.steps} steps in {result.elapsed:.0f}s: train loss "
        f"{result.final_train_loss:.3f}, val loss {_loss(result.val_loss, 3)}{extra}"
    )


def translate_result(kind: str, model: nn.Module, task: Any, result: Any) -> str:
    """Size, steps, losses, the last exact match and BLEU, and a sentence to try."""
    return (
        _trained(kind, model, result, ("val_exact", "val_bleu"))
        + f"\nrun saved in {result.run_dir}; try: attnlab translate {result.run_dir} "
        f'"{task.data.splits["test"][0][0]}"'
    )


def _scene_flag(task: Any) -> str:
    size = task.config.scene.image_size
    return "" if size == 32 else f" --image-size {size}"


def caption_result(model: nn.Module, task: Any, result: Any) -> str:
    """Size, steps, losses, the last BLEU and object precision, and a scene to try."""
    return (
        _trained(f"caption {model.config.arch}", model, result, ("bleu", "object_precision"))
        + f"\nrun saved in {result.run_dir}; try: attnlab scene --out scenes{_scene_flag(task)} "
        f"&& attnlab caption {result.run_dir} scenes/scene_0.png"
    )


def vqa_result(model: nn.Module, task: Any, result: Any) -> str:
    """Size, steps, losses, accuracy beside the answer-frequency baselines, a question to try."""
    acc = task.accuracy_by_type(model, per_type=50)

    def base(by: str) -> float:
        return task.answer_frequency_baseline(by=by, per_type=50)

    c = model.config
    return (
        f"trained vqa {c.arch}/{c.fusion}{' multiple-choice' if c.answers == 'choice' else ''} "
        f"({sum(p.numel() for p in model.parameters()):,} "
        f"parameters) for {result.steps} steps in {result.elapsed:.0f}s: train loss "
        f"{result.final_train_loss:.3f}, val loss {_loss(result.val_loss, 3)}, val accuracy "
        f"{acc['all']:.1%} (answering from training answer frequencies: {base('answer'):.1%} "
        f"with the most common answer, {base('question'):.1%} with each question's)\n"
        f"run saved in {result.run_dir}; try: attnlab scene --out scenes{_scene_flag(task)} && "
        f'attnlab ask {result.run_dir} scenes/scene_0.png "what colour is the circle?"'
    )


def clip_result(model: nn.Module, task: Any, result: Any) -> str:
    """Size, steps, train loss, zero-shot accuracy (val, unseen) and recall@1 against chance."""
    res = task.evaluate_splits(model)
    zs, zu, r = res["zero-shot val"], res["zero-shot unseen"], res["retrieval val"]
    return (
        f"trained clip ({model.config.text.arch} text tower, {n_params(model):,} parameters) for "
        f"{result.steps} steps in {result.elapsed:.0f}s: train loss "
        f"{result.final_train_loss:.3f}; zero-shot {zs['accuracy']:.1%} (unseen combinations "
        f"{zu['accuracy']:.1%}, chance {zs['chance']:.1%}); recall@1 image->text "
        f"{r['i2t@1']:.1%}, text->image {r['t2i@1']:.1%} (chance {r['chance@1']:.1%})\n"
        f"run saved in {result.run_dir}; try: attnlab eval {result.run_dir}"
    )
