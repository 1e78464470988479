"""Read what a forward computes on the side (attention weights, auxiliary losses) without
storing it on modules: ``with capture_attention(model) as maps: ...``.

The captures live with the hook points in :mod:`attnlab.layers.hook` (one module for what
inspection reads from a forward); this path is the one the first release documented.
"""

from __future__ import annotations

from attnlab.layers.hook import (
    AttentionMaps,
    AuxLosses,
    capture_attention,
    capturing_attention,
    capturing_scores,
    collect_aux_losses,
    report_attention,
    report_aux_loss,
)

__all__ = [
    "AttentionMaps",
    "AuxLosses",
    "capture_attention",
    "collect_aux_losses",
    "capturing_attention",
    "capturing_scores",
    "report_attention",
    "report_aux_loss",
]
