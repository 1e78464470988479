"""Read what a forward computes on the side (attention weights, auxiliary losses) without
storing it on modules: ``with capture_attention(model) as maps: ...``.

The captures live with the hook points in :mod:`attnlab.layers.hook` (one module for what
inspection reads from a forward); this path is the one the first release documented.
"""

from __future__ import annotations

from attnlab.layers.hook import CAPTURES
from attnlab.layers.hook import AttentionMaps as AttentionMaps
from attnlab.layers.hook import AuxLosses as AuxLosses
from attnlab.layers.hook import capture_attention as capture_attention
from attnlab.layers.hook import capturing_attention as capturing_attention
from attnlab.layers.hook import capturing_scores as capturing_scores
from attnlab.layers.hook import collect_aux_losses as collect_aux_losses
from attnlab.layers.hook import report_attention as report_attention
from attnlab.layers.hook import report_aux_loss as report_aux_loss

__all__ = list(CAPTURES)  # the names imported above (hook.py lists them once)
