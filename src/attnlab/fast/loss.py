"""The output projection fused with the cross-entropy (:func:`linear_cross_entropy`):
``mean_i CE(h_i Wᵀ + b, y_i)`` in one step, and :class:`FusedLMLoss`, the LM task's choice of it.

A language model's last two operations, ``logits = h Wᵀ`` and the cross-entropy over them, are
the costliest of a training step when the vocabulary is large: GPT-2's 50,257 logits for 1,024
tokens are a 206 MB matrix. Done as two library calls they write that matrix four times
(the logits, their log-softmax, the gradient of the log-softmax, the gradient of the logits),
each time into freshly allocated memory (on a CPU a large allocation is fresh pages from the
kernel: a page fault per 4 KB). Here the gradient is computed in the forward pass, where every
quantity it needs is at hand:

    z = h Wᵀ + b                        (N, V), written once into a buffer kept between steps
    lse_i = log Σ_v exp z_iv            per row, a cache-sized block of rows at a time
    loss = Σ_i valid_i · [lse_i − (1−ε) z_iy − ε mean_v z_iv] / n_valid
    ∂loss/∂z_iv = valid_i · [softmax(z_i)_v − (1−ε)·1{v = y_i} − ε/V] / n_valid

(ε the label smoothing, ``valid`` the targets that are not ``ignore_index``), overwriting ``z``
with its gradient ``G``. The backward is two matmuls, ``∂h = G W`` and ``∂W = Gᵀ h`` (and
``∂b = Σ_i G_i``). The buffer goes to the autograd graph for the backward and comes back after
it; a graph dropped without a backward takes its buffer with it, and the next call makes a new
one, so a buffer is never shared by two live graphs.

The loss equals ``torch.nn.functional.cross_entropy(h @ W.T + b, y, ignore_index=..,
label_smoothing=..)`` (mean over the valid targets; 0 when there are none) and so do the
gradients, up to float rounding (``tests/test_linear_ce.py`` checks both against it).

Shape legend: N rows (batch × time), C features, V classes (vocabulary).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module

from attnlab.fast.matvec import Linear as _MatvecLinear
from attnlab.layers.losses import cross_entropy

# heads whose forward is nn.Linear's (the one-row layer's differs only for single rows)
_ONE_ROW_FORWARDS = (_MatvecLinear.forward,)

__all__ = ["LinearCEBuffer", "linear_cross_entropy", "FusedLMLoss"]


#: bytes of logits processed at a time by the row-wise passes (a block stays in the CPU's cache)
_BLOCK_BYTES = 1 << 20


class LinearCEBuffer:
    """The reusable ``(N, V)`` buffer of :func:`linear_cross_entropy` (one per model).

    Not copied by ``copy.deepcopy`` (a copy starts empty) and never saved: it holds no state,
    only memory that would otherwise be allocated (and, on a CPU, page-faulted) every step.
    """

    def __init__(self) -> None:
        self._free: Tensor | None = None

    def take(self, rows: int, cols: int, like: Tensor) -> Tensor:
        """A ``(rows, cols)`` tensor with ``like``'s dtype and device, owned by the caller until
        :meth:`give_back`."""
        buf, self._free = self._free, None
        n = rows * cols
        if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(n, dtype=like.dtype, device=like.device)
        return buf[:n].view(rows, cols)

    def give_back(self, t: Tensor) -> None:
        """Return a tensor from :meth:`take` (its storage is reused by the next call)."""
        base = t if t._base is None else t._base
        if self._free is None or base.numel() > self._free.numel():
            self._free = base

    def clear(self) -> None:
        """Free the buffer (a later call allocates a new one)."""
        self._free = None

    def __deepcopy__(self, memo) -> LinearCEBuffer:
        return LinearCEBuffer()

    def __getstate__(self) -> dict:
        return {"_free": None}


def _logits_grad_(
    z: Tensor, targets: Tensor, ignore_index: int, label_smoothing: float, grad: bool = True
) -> Tensor:
    """The loss of the logits ``z (N, V)``; with ``grad``, ``z`` is overwritten with ∂loss/∂z
    (without, with scratch values)."""
    N, V = z.shape
    eps = float(label_smoothing)
    valid = targets != ignore_index  # (N,)
    count = valid.sum().clamp_min(1)
    safe = targets.masked_fill(~valid, 0)
    z_y = z.gather(1, safe[:, None])[:, 0]  # (N,) the target's logit
    row_loss = -(1.0 - eps) * z_y
    if eps:
        row_loss -= eps * z.mean(dim=-1)
    lse = torch.empty(N, dtype=z.dtype, device=z.device)
    # a block of rows at a time: max, exp, sum and scale while the block is in cache (one
    # block on a GPU, whose kernels parallelise over the whole matrix)
    rows = N if z.is_cuda else max(1, _BLOCK_BYTES // (V * z.element_size()))
    for i in range(0, N, rows):
        zb = z[i : i + rows]
        m = zb.amax(dim=-1, keepdim=True)  # (R, 1)
        zb.sub_(m).exp_()
        s = zb.sum(dim=-1, keepdim=True)
        if grad:
            zb.div_(s)  # softmax
        lse[i : i + rows] = s.log_().add_(m)[:, 0]
    row_loss += lse
    loss = (row_loss * valid).sum() / count
    if not grad:
        return loss
    # softmax − (1−ε)·onehot − ε/V, zero on ignored rows, / n_valid
    z.scatter_add_(1, safe[:, None], torch.full_like(z_y[:, None], -(1.0 - eps)))
    if eps:
        z.sub_(eps / V)
    scale = valid.to(z.dtype) / count  # (N,)
    z.mul_(scale[:, None])
    return loss


def _logits_into(buffer: LinearCEBuffer, h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``h Wᵀ + b`` written into a tensor taken from ``buffer``: ``(N, V)``."""
    z = buffer.take(h.shape[0], weight.shape[0], h)
    if bias is None:
        return torch.mm(h, weight.t(), out=z)
    return torch.addmm(bias, h, weight.t(), out=z)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, ignore_index, label_smoothing, buffer):
        z = _logits_into(buffer, hidden, weight, bias)  # (N, V)
        loss = _logits_grad_(z, targets, ignore_index, label_smoothing)  # z is now ∂loss/∂z
        ctx.save_for_backward(hidden, weight, z)
        ctx.has_bias, ctx.buffer = bias is not None, buffer
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, g = ctx.saved_tensors  # g (N, V)
        d_hidden = d_weight = d_bias = None
        if ctx.needs_input_grad[0]:
            d_hidden = torch.mm(g, weight).mul_(grad_loss)  # (N, C)
        if ctx.needs_input_grad[1]:
            d_weight = torch.mm(g.t(), hidden).mul_(grad_loss)  # (V, C)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            d_bias = g.sum(dim=0).mul_(grad_loss)
        ctx.buffer.give_back(g)
        del g
        return d_hidden, d_weight, d_bias, None, None, None, None


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    buffer: LinearCEBuffer | None = None,
) -> Tensor:
    """Mean cross-entropy of the logits ``hidden @ weight.T + bias`` against ``targets``, without
    keeping the logits (see the module docstring).

    Args:
        hidden: ``(..., C)`` features (the final norm's output of a language model).
        weight: ``(V, C)`` the output projection (the token embedding when tied).
        targets: ``(...)`` class indices; ``ignore_index`` marks positions that do not count.
        bias: ``(V,)`` or None.
        ignore_index: target value that contributes nothing.
        label_smoothing: ε in [0, 1): the target distribution is ``(1−ε)·onehot + ε/V``.
        buffer: where the ``(N, V)`` logits/gradient live between calls (a model keeps one);
            None allocates them for this call.

    Returns:
        The scalar mean over the valid targets (0.0 when there are none), differentiable with
        respect to ``hidden``, ``weight`` and ``bias``.

    Raises:
        ValueError: shapes that do not fit, dtypes that differ, smoothing outside [0, 1).
    """
    args = (hidden, weight, targets, bias, ignore_index, label_smoothing, buffer)
    if torch.compiler.is_compiling():
        # in a compiled model: a graph break, and this runs as written. The wrapper is made while
        # Dynamo traces (it is loaded then), not at import: ``torch.compiler.disable`` as a
        # decorator would import torch._dynamo (~1.6 s) in every process that imports attnlab's
        # models, compiled or not (tests/test_fast_paths.py checks both).
        return torch.compiler.disable(_linear_cross_entropy)(*args)
    return _linear_cross_entropy(*args)


def _linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    buffer: LinearCEBuffer | None,
) -> Tensor:
    C = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != C:
        raise ValueError(
            f"linear_cross_entropy: weight {tuple(weight.shape)} must be (V, {C}) for hidden "
            f"{tuple(hidden.shape)}"
        )
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"linear_cross_entropy: hidden {tuple(hidden.shape)} needs targets of shape "
            f"{tuple(hidden.shape[:-1])}, got {tuple(targets.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias {tuple(bias.shape)} must be ({weight.shape[0]},)")
    if hidden.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise ValueError(
            f"linear_cross_entropy: hidden ({hidden.dtype}) and weight ({weight.dtype}) must "
            "have one dtype"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    h = hidden.reshape(-1, C).contiguous()
    buffer = LinearCEBuffer() if buffer is None else buffer
    y = targets.reshape(-1)
    if torch.is_grad_enabled() and (
        h.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return _LinearCrossEntropy.apply(
            h, weight, bias, y, ignore_index, float(label_smoothing), buffer
        )
    with torch.no_grad():  # the loss only: the buffer comes back at once
        z = _logits_into(buffer, h, weight, bias)
        loss = _logits_grad_(z, y, ignore_index, float(label_smoothing), grad=False)
        buffer.give_back(z)
        return loss


class FusedLMLoss:
    """The LM loss with the output projection fused: ``loss(h, head, targets)`` is
    ``cross_entropy(head(h), targets)`` computed by :func:`linear_cross_entropy`, with one
    :class:`LinearCEBuffer` kept here (not on the model) between steps.

    Pass it to a language model's forward, ``model(idx, targets=y, head_loss=FusedLMLoss())``
    (what :class:`attnlab.tasks.LMTask` does), so that the loss runs inside the model's forward
    (DDP and FSDP see one forward). The plain path is taken where fusing would change what is
    computed or observed: under autocast (the head's matmul dtype), with a replaced head (an
    int8 layer) or hooks on it (an inspection), or with hidden states in another dtype; the value
    is the same either way.
    """

    def __init__(self) -> None:
        self.buffer = LinearCEBuffer()

    def __call__(
        self,
        hidden: Tensor,
        head: nn.Module,
        targets: Tensor,
        *,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
    ) -> Tensor:
        """Mean cross-entropy of ``head(hidden (B, T, C))`` against ``targets (B, T)``."""
        if _fusable(hidden, head):
            return linear_cross_entropy(
                hidden,
                head.weight,
                targets,
                bias=head.bias,
                ignore_index=ignore_index,
                label_smoothing=label_smoothing,
                buffer=self.buffer,
            )
        return cross_entropy(
            head(hidden), targets, ignore_index=ignore_index, label_smoothing=label_smoothing
        )


def _fusable(hidden: Tensor, head: nn.Module) -> bool:
    # hooks on the head, or global ones (attnlab.inspect, torch's profilers), must see its call
    return (
        isinstance(head, nn.Linear)
        and type(head).forward in (nn.Linear.forward, *_ONE_ROW_FORWARDS)
        and not (head._forward_hooks or head._forward_pre_hooks)
        and not (_module._global_forward_hooks or _module._global_forward_pre_hooks)
        and not torch.is_autocast_enabled(hidden.device.type)
        and hidden.dtype == head.weight.dtype
    )
