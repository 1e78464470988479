"""VQA as multiple choice: each answer's word vector scored against the fused feature."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config.base import ConfigError
from attnlab.config.multimodal import VQA_MODELS, VQAConfig
from attnlab.data.scenes import build_vocab
from attnlab.models.multimodal.answers import AnswerScorer
from attnlab.models.multimodal.vqa import build_vqa

VOCAB = build_vocab()
IDS = [VOCAB.stoi[a] for a in VOCAB.answers]


def blind() -> torch.nn.Module:
    torch.manual_seed(0)
    config = VQAConfig.preset(
        "tiny", **VQA_MODELS["blind"], vocab_size=len(VOCAB), n_answers=len(IDS),
        answers="choice", answer_ids=IDS,
    )  # fmt: skip
    return build_vqa(config).eval()


def test_scores_are_the_query_times_the_projected_answer_embeddings():
    model = blind()
    assert isinstance(model.head, AnswerScorer)
    questions = torch.tensor([VOCAB.encode("what colour is the circle ?")[0]])
    lengths = torch.tensor([questions.shape[1]])
    with torch.no_grad():
        logits = model(torch.zeros(1, 3, 32, 32), questions, lengths)
        q = model.head.query(model.question_vector(questions, lengths))  # (1, D)
        W, b = model.head.answer_proj.weight, model.head.answer_proj.bias
        want = torch.stack([q[0] @ (W @ model.tok_emb.weight[i] + b) for i in IDS])
    torch.testing.assert_close(logits[0], want)


def test_an_answer_is_read_through_its_word_embedding():
    """Editing the embedding of the word 'purple' (not in the question) moves its score only."""
    model = blind()
    questions = torch.tensor([VOCAB.encode("how many circles are there ?")[0]])
    lengths = torch.tensor([questions.shape[1]])
    args = (torch.zeros(1, 3, 32, 32), questions, lengths)
    with torch.no_grad():
        before = model(*args)[0]
        model.tok_emb.weight[VOCAB.stoi["purple"]] += 1.0
        after = model(*args)[0]
    moved = (after - before).abs() > 1e-6
    assert moved.tolist() == [a == "purple" for a in VOCAB.answers]


def test_choice_needs_one_word_id_per_answer():
    with pytest.raises(ConfigError, match="needs the word id of each"):
        VQAConfig.preset("tiny", vocab_size=len(VOCAB), n_answers=len(IDS), answers="choice")


def test_train_vqa_answers_choice_trains_and_loads(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "vqa", "--model", "lstm-concat", "--answers", "choice", "--out", str(out)]
    args += ["--steps", "3", "--batch-size", "8", "--n-train", "30", "--n-val", "10"]
    args += ["--eval-every", "3", "--eval-batches", "1", "--no-progress", "--device", "cpu"]
    args += ["--image-size", "16", "--set", "task.eval_per_type=2"]
    assert main(args) == 0
    assert "multiple-choice" in capsys.readouterr().out
    run = attnlab.load(out)
    assert run.model.config.answers == "choice" and run.model.config.answer_ids == IDS
