"""The LLaVA-style prefix captioner: its mask (words see every image token and only earlier
words; image tokens see no word), incremental decoding equal to the teacher-forced pass, and the
image actually reaching the words."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention.capture import capture_attention
from attnlab.cli import main
from attnlab.config.base import ConfigError
from attnlab.config.multimodal import CaptionConfig, VQAConfig
from attnlab.explore.explorer import Explorer
from attnlab.models.multimodal.captioner import build_captioner
from attnlab.models.multimodal.prefix import PrefixCaptioner, prefix_mask


def tiny() -> PrefixCaptioner:
    torch.manual_seed(0)
    config = CaptionConfig.preset(
        "tiny", arch="prefix", encoder="vit", vocab_size=30, image_size=16
    )
    model = build_captioner(config)
    assert isinstance(model, PrefixCaptioner)
    return model.eval()


def test_prefix_mask_written_out():
    m = prefix_mask(2, 3)
    want = torch.tensor(
        [
            [1, 1, 0, 0, 0],  # image token 0: the image only
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],  # word 0: the image and itself
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(m, want)


def test_words_see_the_whole_image_and_only_earlier_words():
    model = tiny()
    images, tokens = torch.rand(2, 3, 16, 16), torch.randint(4, 30, (2, 6))
    n = model.n_image
    with torch.no_grad():
        base = model(images, tokens)
        later = tokens.clone()
        later[:, 4:] = 5
        torch.testing.assert_close(model(images, later)[:, :4], base[:, :4])  # causal words
        other = images.clone()
        other[:, :, :4, :4] = 1.0  # one corner patch changes
        assert (model(other, tokens)[:, 0] - base[:, 0]).abs().max() > 1e-4  # word 0 sees it
        with capture_attention(model) as maps:
            model(images, tokens)
    for name in (n for n in maps if n.startswith("blocks.")):
        w = maps[name]  # (B, H, N + L, N + L)
        assert w.shape[-1] == n + 6
        assert torch.all(w[..., :n, n:] == 0)  # image tokens never read a word
        assert torch.all(w[..., n:, :n] > 0)  # every word reads every image token
        assert torch.all(w[..., n:, n:].triu(1) == 0)  # and no later word


def test_incremental_decoding_equals_the_teacher_forced_pass():
    model = tiny()
    images, tokens = torch.rand(2, 3, 16, 16), torch.randint(4, 30, (2, 5))
    tokens[:, 0] = 2
    with torch.no_grad():
        full = model(images, tokens)  # (B, L, V)
        state = model.start_decoding(images, 8)
        first, state = model.decode_step(tokens[:, :2], state)  # two words at once
        steps = [first]
        for t in range(2, 5):
            logits, state = model.decode_step(tokens[:, t : t + 1], state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 1:], atol=1e-5, rtol=1e-5)


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="rotate or bias the image tokens"):
        CaptionConfig.preset("tiny", arch="prefix", position="rope")
    with pytest.raises(ConfigError, match="unknown arch 'prefix'"):  # a captioner only
        VQAConfig.preset("tiny", arch="prefix")


def test_train_caption_prefix_captions_and_shows_text_to_image_attention(tmp_path, capsys):
    args = ["train", "caption", "--model", "prefix", "--encoder", "vit", "--image-size", "16"]
    args += ["--out", str(tmp_path / "run"), "--steps", "2", "--batch-size", "8"]
    args += ["--n-train", "30", "--n-val", "10", "--eval-every", "2", "--eval-batches", "1"]
    args += ["--no-progress", "--device", "cpu", "--set", "task.eval_scenes=4"]
    assert main(args) == 0
    assert main(["scene", "--out", str(tmp_path / "s"), "--image-size", "16"]) == 0
    capsys.readouterr()
    assert main(["caption", str(tmp_path / "run"), str(tmp_path / "s" / "scene_0.png")]) == 0
    assert capsys.readouterr().out.strip()  # some caption
    explorer = Explorer(tmp_path / "run")
    payload = explorer.explain(explorer.default_input())
    cross = next(v for v in payload["views"] if v["id"] == "cross")
    assert len(cross["keys"]) == 16 and "image prefix" in cross["title"]
    words = next(v for v in payload["views"] if v["id"] == "words")
    assert len(words["keys"]) == len(words["queries"]) == len(cross["queries"])
