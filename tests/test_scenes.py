"""Scene generator: answers correct by construction on hand-built layouts, rendering, splits,
vocabulary and the training tasks' batches."""

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.data.scenes import (
    COLOURS,
    QUESTION_TYPES,
    Scene,
    SceneConfig,
    SceneObject,
    SceneSet,
    Vocab,
    answer_list,
    build_vocab,
    mentioned_objects,
    read_scene_image,
    render_scene,
    scene_captions,
    scene_questions,
    shape_label,
)
from attnlab.errors import UserError
from attnlab.tasks.caption import CaptionTask, CaptionTaskConfig
from attnlab.tasks.vqa import VQATask


def make_scene(*objs) -> Scene:
    return Scene(tuple(SceneObject(c, s, x, y) for c, s, x, y in objs), 32, 4.0)


# red circle top-left; blue square top-right; green triangle below the circle; yellow square
# bottom-right. Distances from the red circle: triangle 16.0, blue square 21.0, yellow square 26.9.
LAYOUT = make_scene(
    ("red", "circle", 6, 6),
    ("blue", "square", 27, 6),
    ("green", "triangle", 7, 22),
    ("yellow", "square", 24, 26),
)


def answers(scene: Scene) -> dict[str, str]:
    return {qa.question: qa.answer for qa in scene_questions(scene)}


def test_colour_question_names_the_unique_shape():
    qa = answers(LAYOUT)
    assert qa["what colour is the circle ?"] == "red"
    assert qa["what colour is the triangle ?"] == "green"
    assert "what colour is the square ?" not in qa  # two squares: ambiguous, not asked


def test_shape_question_names_the_unique_colour():
    qa = answers(LAYOUT)
    assert qa["what shape is the blue object ?"] == "square"
    assert qa["what shape is the green object ?"] == "triangle"


def test_position_questions_use_the_image_centre():
    qa = answers(LAYOUT)
    assert qa["is the red circle on the left or the right ?"] == "left"
    assert qa["is the blue square on the left or the right ?"] == "right"
    assert qa["is the yellow square at the top or the bottom ?"] == "bottom"
    assert qa["is the red circle at the top or the bottom ?"] == "top"


def test_closest_and_farthest_objects():
    qa = answers(LAYOUT)
    assert qa["what shape is the object closest to the red circle ?"] == "triangle"
    assert qa["what colour is the object closest to the red circle ?"] == "green"
    assert qa["what shape is the object farthest from the red circle ?"] == "square"
    assert qa["what colour is the object farthest from the red circle ?"] == "yellow"
    # from the yellow square (24, 26): blue square 20.2, green triangle 17.5, red circle 26.9
    assert qa["what colour is the object closest to the yellow square ?"] == "green"


def test_counts_include_zero():
    qa = answers(LAYOUT)
    assert qa["how many squares are there ?"] == "two"
    assert qa["how many circles are there ?"] == "one"
    assert qa["how many purple objects are there ?"] == "zero"
    assert qa["how many red objects are there ?"] == "one"


def test_left_of_between_named_objects():
    qa = answers(LAYOUT)
    assert qa["is the red circle left of the blue square ?"] == "yes"
    assert qa["is the yellow square left of the green triangle ?"] == "no"


def test_every_question_type_occurs_in_the_hand_layout():
    assert {qa.qtype for qa in scene_questions(LAYOUT)} == set(QUESTION_TYPES)


def test_ambiguous_questions_are_not_asked():
    # The circle sits on the vertical centre line, equally far from both other objects.
    scene = make_scene(
        ("red", "circle", 16, 6), ("blue", "square", 8, 20), ("green", "triangle", 24, 20)
    )
    qa = answers(scene)
    assert "is the red circle on the left or the right ?" not in qa
    assert qa["is the red circle at the top or the bottom ?"] == "top"
    assert not any(
        "closest to the red circle" in q or "farthest from the red circle" in q for q in qa
    )
    # Repeated objects are never named.
    dup = make_scene(
        ("green", "triangle", 6, 6), ("green", "triangle", 26, 26), ("red", "circle", 26, 6)
    )
    assert not any("the green triangle" in q for q in answers(dup))
    assert answers(dup)["how many triangles are there ?"] == "two"


def test_captions_of_the_hand_layout():
    caps = scene_captions(LAYOUT)
    assert caps[0] == "a red circle , a green triangle , a yellow square and a blue square"
    assert "a red circle above a green triangle" in caps  # dx = 1, dy = 16: vertical relation
    assert "a red circle left of a blue square" in caps
    dup = make_scene(
        ("green", "triangle", 6, 6), ("green", "triangle", 26, 26), ("orange", "circle", 26, 6)
    )
    caps = scene_captions(dup)
    assert "two green triangles" in caps
    assert "a green triangle left of an orange circle . two green triangles" in caps
    for cap in caps:  # a caption only names objects in the scene
        assert set(mentioned_objects(cap)) <= {("green", "triangle"), ("orange", "circle")}


def test_render_puts_each_colour_at_its_object():
    img = render_scene(LAYOUT)
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8
    for o in LAYOUT.objects:
        assert tuple(img[int(o.y), int(o.x)]) == COLOURS[o.colour]
    assert tuple(img[0, 16]) not in COLOURS.values()  # background between objects


def test_shapes_are_told_apart_by_pixels():
    """At the scenes' size (32 px, radius 4) any two shapes differ in at least 16 pixels (the
    triangle is the smallest, then the square, then the circle); drawn large, each covers its
    continuous area within 2 %: a circle pi r^2, a square of half-side 0.85 r (1.7 r)^2, an
    apex-up triangle of height and base 2 r: 2 r^2."""

    def drawn(shape: str, size: int, r: float) -> np.ndarray:
        scene = Scene((SceneObject("red", shape, size / 2, size / 2),), size, r)
        return (render_scene(scene) == COLOURS["red"]).all(-1)

    masks = {shape: drawn(shape, 32, 4.0) for shape in ("circle", "square", "triangle")}
    for a, b in [("circle", "square"), ("circle", "triangle"), ("square", "triangle")]:
        assert (masks[a] ^ masks[b]).sum() >= 16, (a, b)
    area = {k: int(m.sum()) for k, m in masks.items()}
    assert area["triangle"] < area["square"] < area["circle"]
    r = 60.0
    for shape, formula in [
        ("circle", np.pi * r**2),
        ("square", (1.7 * r) ** 2),
        ("triangle", 2 * r**2),
    ]:
        assert drawn(shape, 256, r).sum() == pytest.approx(formula, rel=0.02), shape
    rows = drawn("triangle", 256, r).sum(1)
    assert rows[128 - 50] < rows[128] < rows[128 + 50]  # apex up: wider towards the base


def test_splits_hold_out_combinations():
    cfg = SceneConfig()
    held = set(cfg.heldout_combos())
    train = SceneSet(cfg, "train", 200, seed=3)
    unseen = SceneSet(cfg, "unseen", 100, seed=3)
    assert all((o.colour, o.shape) not in held for s in train.scenes for o in s.objects)
    assert all(any((o.colour, o.shape) in held for o in s.objects) for s in unseen.scenes)
    # the held-out words still occur in training, only their combination is new
    words = {w for caps in train.captions for c in caps for w in c.split()}
    assert {"red", "triangle", "green", "square", "blue", "circle"} <= words


def test_generation_is_deterministic_and_non_overlapping():
    cfg = SceneConfig(max_objects=5)
    a, b = SceneSet(cfg, "train", 50, seed=1), SceneSet(cfg, "train", 50, seed=1)
    assert np.array_equal(a.images, b.images) and a.captions == b.captions
    assert not np.array_equal(a.images, SceneSet(cfg, "train", 50, seed=2).images)
    for s in a.scenes:
        assert cfg.min_objects <= len(s.objects) <= cfg.max_objects
        for i, p in enumerate(s.objects):
            for q in s.objects[i + 1 :]:
                assert np.hypot(p.x - q.x, p.y - q.y) >= 2 * s.radius + 2


def test_config_validation_names_the_values():
    with pytest.raises(ValueError, match="max_objects=2"):
        SceneConfig(min_objects=3, max_objects=2)
    with pytest.raises(ValueError, match="pink"):
        SceneConfig(colours=("red", "pink"))
    with pytest.raises(ValueError, match="do not fit"):
        SceneConfig(image_size=16, max_objects=9)
    assert SceneConfig.from_dict(SceneConfig(image_size=48).to_dict()) == SceneConfig(image_size=48)


def test_vocab_covers_generated_text_and_flags_unknown_words():
    v = build_vocab()
    sset = SceneSet(SceneConfig(), "unseen", 60)
    for caps, qs in zip(sset.captions, sset.questions):
        for c in caps:
            ids = v.encode_caption(c)
            assert ids[0] == Vocab.START and ids[-1] == Vocab.END and Vocab.UNK not in ids
            assert v.decode(ids) == c
        for qa in qs:
            assert v.encode(qa.question)[1] == [] and qa.answer in answer_list()
    ids, unknown = v.encode("What color is the zebra?")
    assert unknown == ["zebra"] and ids.count(Vocab.UNK) == 1  # "color" is an alias of "colour"
    assert v.encode("is the café 12 ?")[1] == ["café", "12"]  # whole words, whole numbers
    assert v.stoi["."] not in (Vocab.END, Vocab.START)  # the full stop is an ordinary word
    assert v.decode([Vocab.START, v.stoi["two"], v.stoi["."], Vocab.END, v.stoi["red"]]) == "two ."
    two = v.encode_caption("a red circle left of a blue square . two green triangles")
    assert two.count(Vocab.END) == 1 and two[-1] == Vocab.END and v.stoi["."] in two[1:-1]


def test_shape_label_is_the_majority_shape():
    assert shape_label(LAYOUT) == 1  # two squares
    assert shape_label(make_scene(("red", "triangle", 6, 6))) == 2


def test_read_scene_image_errors(tmp_path):
    good = tmp_path / "s.png"
    Image.fromarray(render_scene(LAYOUT)).save(good)
    x = read_scene_image(good, 32)
    assert x.shape == (1, 3, 32, 32) and float(x.max()) <= 1.0
    with pytest.raises(UserError, match="64x64.*drop --no-resize"):
        read_scene_image(good, 64, resize=False)
    # another size is resized as classify resizes; an 8x enlarged copy reads back as the scene
    Image.fromarray(render_scene(LAYOUT)).resize((256, 256), Image.NEAREST).save(
        tmp_path / "x8.png"
    )
    torch.testing.assert_close(read_scene_image(tmp_path / "x8.png", 32), x)
    assert read_scene_image(good, 48).shape == (1, 3, 48, 48)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(UserError, match="cannot read"):
        read_scene_image(bad, 32)
    with pytest.raises(UserError, match="does not exist"):
        read_scene_image(tmp_path / "missing.png", 32)
    with pytest.raises(UserError, match="not an image file"):
        read_scene_image(tmp_path, 32)
    grey = tmp_path / "grey.png"  # other modes are converted to RGB
    Image.fromarray(render_scene(LAYOUT)[..., 0]).save(grey)
    torch.testing.assert_close(read_scene_image(grey, 32)[0, 1], x[0, 0])


def test_evaluation_skips_question_types_a_tiny_split_lacks():
    """One validation scene without a closest/farthest question (two circles and a square on
    a line, the square in the middle): evaluation uses the types it has instead of searching
    forever."""
    task = VQATask(n_train=5, n_val=1, n_unseen=1)
    scene = make_scene(
        ("red", "circle", 6, 16), ("blue", "square", 16, 16), ("red", "circle", 26, 16)
    )
    task.sets("val").scenes[0] = scene
    task.sets("val").questions[0] = scene_questions(scene)
    types = {qa.qtype for _, qa in task.eval_pairs("val", 3)}
    assert types == {qa.qtype for qa in scene_questions(scene)} and "closest" not in types
    assert 0.0 <= task.answer_frequency_baseline(by="question") <= 1.0
    with pytest.raises(ValueError, match="by="):
        task.answer_frequency_baseline(by="colour")


def test_tasks_batches_are_deterministic_and_split_over_ranks():
    task = VQATask(n_train=50, n_val=20, n_unseen=10)
    b1, b2 = task.get_batch("train", 3, 8), task.get_batch("train", 3, 8)
    assert all(torch.equal(b1[k], b2[k]) for k in b1)
    assert not torch.equal(task.get_batch("train", 4, 8)["answers"], b1["answers"])
    r0, r1 = task.get_batch("train", 3, 8, 0, 2), task.get_batch("train", 3, 8, 1, 2)
    assert r0["images"].shape[0] == 4 and not torch.equal(r0["images"], r1["images"])
    assert b1["questions"].shape[0] == 8 and b1["lengths"].max() == b1["questions"].shape[1]
    assert set(b1["qtypes"].tolist()) <= set(range(len(QUESTION_TYPES)))
    ev = list(task.eval_batches(16, 3))
    again = next(iter(task.eval_batches(16, 1)))
    assert len(ev) == 3 and torch.equal(ev[0]["answers"], again["answers"])
    cap = CaptionTask(n_train=30, n_val=10, n_unseen=10)
    cb = cap.get_batch("train", 0, 6)
    assert cb["tokens"][:, 0].eq(Vocab.START).all() and cb["images"].shape == (6, 3, 32, 32)
    assert (cb["tokens"] == Vocab.END).sum() == 6
    assert cap.config_dict()["scene"]["image_size"] == 32


def test_task_config_round_trips_and_reads_first_release_task_sections():
    """config.json's "task" is the task config's to_dict(); the first release also wrote the
    task's name there, which is accepted and dropped."""
    cfg = CaptionTaskConfig(scene=SceneConfig(image_size=48), n_train=30, pretrain_steps=2)
    assert CaptionTaskConfig.from_dict(cfg.to_dict()) == cfg
    old = {"name": "caption", **cfg.to_dict()}
    del old["eval_scenes"], old["pretrain_steps"]  # not in the first release
    assert CaptionTaskConfig.from_dict(old).scene.image_size == 48
    task = CaptionTask(cfg)
    assert task.config_dict() == cfg.to_dict() and task.sets("train").images.shape[1] == 48
    with pytest.raises(ValueError, match="n_trian"):
        CaptionTaskConfig.from_dict({"n_trian": 3})
