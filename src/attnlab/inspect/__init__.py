"""Look inside any attnlab model: cached activations, hooks that edit them, ablation, activation
patching, the logit lens, direct logit attribution and per-head diagnostics.

Every family's activations pass through named hook points (:mod:`attnlab.layers.hook`), named as
TransformerLens names them where the concept is the same (``blocks.0.attn.hook_pattern``,
``blocks.0.hook_resid_post``); ``docs/inspect.md`` lists them per family.
"""

from attnlab.inspect.ablation import ablate_experts, ablate_heads, ablate_neurons, ablation_hooks
from attnlab.inspect.diagnostics import (
    HeadScores,
    alignment_agreement,
    diagnose,
    flag_head,
    pattern_scores,
    repeated_tokens,
)
from attnlab.inspect.families import Stack, find_stacks, stack_of
from attnlab.inspect.hooks import (
    ActivationCache,
    hooks,
    list_hook_names,
    run_with_cache,
    run_with_hooks,
)
from attnlab.inspect.lens import direct_logit_attribution, logit_lens
from attnlab.inspect.patching import patch, patch_heads, patch_positions

__all__ = [
    "ActivationCache",
    "HeadScores",
    "Stack",
    "ablate_experts",
    "ablate_heads",
    "ablate_neurons",
    "ablation_hooks",
    "alignment_agreement",
    "diagnose",
    "direct_logit_attribution",
    "find_stacks",
    "flag_head",
    "hooks",
    "list_hook_names",
    "logit_lens",
    "patch",
    "patch_heads",
    "patch_positions",
    "pattern_scores",
    "repeated_tokens",
    "run_with_cache",
    "run_with_hooks",
    "stack_of",
]
