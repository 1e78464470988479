"""Generated scenes for captioning and VQA, in the spirit of Sort-of-CLEVR.

- :mod:`~attnlab.data.scenes.world`: the scene generator (:class:`SceneConfig`, splits with
  held-out colour–shape combinations);
- :mod:`~attnlab.data.scenes.render`: drawing scenes, reading scene images as tensors;
- :mod:`~attnlab.data.scenes.captions`: reference captions computed from the layout;
- :mod:`~attnlab.data.scenes.questions`: unambiguous questions and their answers by type;
- :mod:`~attnlab.data.scenes.vocab`: the word vocabulary and answer list (:class:`Vocab`);
- :mod:`~attnlab.data.scenes.dataset`: :class:`SceneSet`, a fixed set of scenes of one split.

The training tasks built on them are :mod:`attnlab.tasks.caption` and :mod:`attnlab.tasks.vqa`.
"""

from attnlab.data.scenes.captions import mentioned_objects, plural, scene_captions
from attnlab.data.scenes.dataset import SceneSet
from attnlab.data.scenes.questions import (
    NON_RELATIONAL,
    QA,
    QUESTION_TYPES,
    RELATIONAL,
    answer_list,
    scene_questions,
)
from attnlab.data.scenes.render import images_to_tensor, read_scene_image, render_scene
from attnlab.data.scenes.vocab import Vocab, build_vocab, tokenize
from attnlab.data.scenes.world import (
    COLOURS,
    NUMBER_WORDS,
    SHAPES,
    SPLITS,
    Scene,
    SceneConfig,
    SceneObject,
    generate_scene,
    shape_label,
)

__all__ = [
    "COLOURS",
    "SHAPES",
    "NUMBER_WORDS",
    "SPLITS",
    "QUESTION_TYPES",
    "NON_RELATIONAL",
    "RELATIONAL",
    "SceneConfig",
    "SceneObject",
    "Scene",
    "QA",
    "generate_scene",
    "render_scene",
    "scene_captions",
    "scene_questions",
    "SceneSet",
    "Vocab",
    "build_vocab",
    "tokenize",
    "answer_list",
    "mentioned_objects",
    "plural",
    "read_scene_image",
    "images_to_tensor",
    "shape_label",
]
