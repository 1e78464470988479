"""Weight-only int8 linear layers: per-output-channel scales, dequantised inside the matmul.

Decoding one token at a time reads every weight once per token, so its speed is the weights'
bytes divided by the memory bandwidth. Storing the weights as int8 halves the bytes of bf16 (a
quarter of fp32) while the activations keep their floating-point type.

Quantisation (symmetric, per output channel n, absmax):

    s_n = max_k |W_nk| / 127,      Q_nk = round(W_nk / s_n) ∈ [−127, 127]
    y_n = s_n · Σ_k Q_nk x_k  (+ b_n)

Error bound: rounding moves each weight by at most s_n / 2, so for every output

    |y_n − ŷ_n| ≤ (s_n / 2) · ‖x‖₁

(plus the floating-point rounding of the matmul itself). :func:`int8_error_bound` computes it;
the tests check each layer against it. Typical size: the rounding error is uniform within
±s_n/2 (RMS s_n/√12) and a Gaussian row has absmax ≈ σ·√(2 ln K), so the weights move by
≈ 0.8 % of their RMS and so does each matmul's output (relative L2). Through a model of L blocks
(4·L + 1 matmuls) the errors add roughly in quadrature: ≈ 0.8 % · √(4L + 1) relative error of the
logits, 2.4 % for 2 blocks, 4 % for 6 (measured: 1.6 % and 3.5 % with trained-size weights). The
tests allow 5 % on a 2-block model.

On a CPU the product runs in ``torch._weight_int8pack_mm`` (int8 weights converted in registers,
never materialised as floats); elsewhere, and for shapes that kernel does not take, the portable
form ``(x @ Q.to(x.dtype)ᵀ) · s`` (which ``torch.compile`` fuses on a GPU). On an x86 CPU
torch's kernel is fast for bf16 activations only: with fp32 or fp16 ones it is a scalar loop,
~10× an fp32 matmul, on AVX2 (a decoding step of a 4 × 512 LM with fp32 activations took 4.6×
fp32's, the portable form 1.7×) and with AVX-512 too (an AVX-512 EPYC, torch 2.13, one thread,
2048 × 512: fp32 856 µs a row against MKL's fp32 product's 88 µs; fp16 1,579 µs). There the
layer takes the portable form for those dtypes (:func:`kernel_dtypes`) and
:func:`quantize_int8` warns: use bf16 activations (``load(..., quantize="int8")``'s default).

Prepared for decoding (:func:`attnlab.fast.for_decoding`, which applies
:func:`attnlab.fast.matvec.use_matvec`), a layer sends one row or a few (a decoding step, a
speculative verification) to attnlab's own AVX2 kernel instead on CPUs without AVX-512
(:func:`attnlab.fast.matvec.int8_matvec`): 1.2–2× torch's with bf16 activations, and vectorised
for fp32 and fp16 ones too; more rows (a prompt) take MKL's fp32 product of the dequantised
weights, 1.6–2× torch's int8 kernel with bf16 activations there. On CPUs with AVX-512 BF16 a
prepared layer with bf16 activations takes :mod:`attnlab.fast.int8_bf16` instead: a few rows
through its kernel (the CPU's bf16 pair products: level with torch's for one row, 1.4–1.8× it
at 5–33 rows, where torch's cost grows with every row), a prompt through oneDNN's bf16 product
of the weights converted to bf16 (2.4× torch's at 96 rows). A layer built alone, and on other
AVX-512 CPUs, keeps torch's product (bf16 activations) or the portable form.

Shape legend: N output features, K input features, ``...`` leading dimensions of x.
"""

from __future__ import annotations

import logging
import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.fast import int8_bf16
from attnlab.fast.matvec import ROWS_INT8, int8_rows_path

__all__ = ["Int8Linear", "quantize_int8", "int8_error_bound", "kernel_dtypes"]

_QMAX = 127
# the CPU kernel reads K in vectors of 8 (bf16 crashes on other widths in torch 2.13)
_KERNEL_K_MULTIPLE = 8


def _kernel_available() -> bool:
    return hasattr(torch, "_weight_int8pack_mm")


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def kernel_dtypes() -> frozenset[torch.dtype]:
    """The activation dtypes for which this CPU runs torch's int8 kernel fast: bf16 only on x86
    (with AVX2 and with AVX-512 alike, fp32 and fp16 activations run a scalar loop there: ~10×
    MKL's fp32 product of the dequantised weights, measured on both); fp32, bf16 and fp16 on
    other architectures."""
    if not _kernel_available():
        return frozenset()
    if not _x86():
        return frozenset((torch.float32, torch.bfloat16, torch.float16))
    return frozenset((torch.bfloat16,))


class Int8Linear(nn.Module):
    """A linear layer with int8 weights ``(N, K)`` and one float scale per output channel.

    Build it from a trained layer with :meth:`from_linear`. The activations keep their dtype
    (fp32, bf16, fp16): the output has the input's dtype.

    Args:
        in_features: K.
        out_features: N.
        bias: with a bias (kept in floating point).
        device, dtype: where the scales and bias live and their dtype.

    Attributes:
        weight: ``(N, K)`` int8 buffer Q.
        scale: ``(N,)`` per-channel scales s (the dtype of the layer quantised: bf16 scales for a
            bf16 model, the activations' dtype, so a compiled step needs no conversion).
        bias: ``(N,)`` or None.
    """

    def __init__(
        self, in_features: int, out_features: int, *, bias: bool = True, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        #: activation dtypes run through torch's CPU int8 kernel (:func:`kernel_dtypes`); other
        #: dtypes take the portable form
        self.kernel_dtypes = kernel_dtypes()
        #: a few rows (a decoding step, a speculative verification) through attnlab's own CPU
        #: kernel (:func:`attnlab.fast.matvec.int8_matvec`); set by
        #: :func:`attnlab.fast.matvec.use_matvec` (``for_decoding``), off for a layer built alone
        self.few_rows_kernel = False
        #: bf16 activations take :mod:`attnlab.fast.int8_bf16` (a few rows: its AVX-512 BF16
        #: kernel; more: oneDNN's bf16 product of the converted weights); set by
        #: :func:`attnlab.fast.matvec.use_matvec` on CPUs with AVX-512 BF16
        self.bf16_kernel = False
        self.register_buffer(
            "weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.register_buffer("scale", torch.ones(out_features, device=device, dtype=dtype))
        self.bias = (
            nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False)
            if bias
            else None
        )

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantise ``linear`` (absmax per output channel, see the module docstring)."""
        w = linear.weight.detach().float()  # (N, K)
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / _QMAX  # (N,); an all-zero row stays zero
        # the scales are kept in the layer's dtype (the kernel takes them in the activations'
        # dtype, and a conversion inside a compiled step does not lower); Q is rounded against
        # the stored scale, so the bound below holds for it (|W/s| exceeds 127 by < 0.5)
        scale = scale.to(linear.weight.dtype).float()
        q = torch.round(w / scale[:, None]).clamp(-_QMAX, _QMAX).to(torch.int8)
        out = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            device=w.device,
            dtype=linear.weight.dtype,
        )
        out.weight.copy_(q)
        out.scale.copy_(scale)
        if linear.bias is not None:
            out.bias.data.copy_(linear.bias.detach())
        return out

    def dequantized(self) -> Tensor:
        """The float weights ``s_n · Q_nk`` ``(N, K)`` this layer computes with (fp32)."""
        return self.weight.float() * self.scale.float()[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., K) -> (..., N)`` in x's dtype."""
        if self.few_rows_kernel and int8_rows_path(x):
            return torch.ops.attnlab.int8_matvec(x, self.weight, self.scale, self.bias)
        if self.bf16_kernel and int8_bf16.takes_kernel(x):
            return torch.ops.attnlab_bf16.int8_rows(x, self.weight, self.scale, self.bias)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        if self.few_rows_kernel and x.device.type == "cpu" and x2.shape[0] > ROWS_INT8:
            # a prompt on a CPU without AVX-512: MKL's fp32 product of the dequantised weights,
            # 1.6-2x torch's int8 kernel with bf16 activations at 64-512 rows (2048 x 512)
            y = F.linear(x2.float(), self.weight.float()) * self.scale.float()
            if self.bias is not None:
                y = y + self.bias.float()
            return y.to(x.dtype).reshape(*lead, self.out_features)
        scale = self.scale if self.scale.dtype == x.dtype else self.scale.to(x.dtype)
        # a prompt of bf16 rows on a CPU with AVX-512 BF16 takes the portable form: oneDNN's bf16
        # product of the weights converted to bf16 (exact), 2.4x torch's int8 kernel at 96 rows
        # (2048 x 512)
        bf16_prompt = self.bf16_kernel and x2.shape[0] > int8_bf16.ROWS_INT8_BF16
        use_kernel = (
            x.device.type == "cpu"
            and x.dtype in self.kernel_dtypes
            and self.in_features % _KERNEL_K_MULTIPLE == 0
            and not bf16_prompt
        )
        if use_kernel:
            y = torch._weight_int8pack_mm(x2.contiguous(), self.weight, scale)  # (M, N)
        else:
            y = F.linear(x2, self.weight.to(x.dtype)) * scale  # (M, N)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, weight=int8"
        )


def int8_error_bound(layer: Int8Linear, x: Tensor) -> Tensor:
    """The bound ``(s_n / 2) · ‖x‖₁`` on ``|linear(x) − layer(x)|`` for each output ``(..., N)``."""
    return 0.5 * x.float().abs().sum(-1, keepdim=True) * layer.scale


def quantize_int8(model: nn.Module, *, skip: tuple[str, ...] = ()) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (the LM head included) by an :class:`Int8Linear`.

    In place; returns ``model``. An output head tied to the token embedding gets its own int8
    copy (the embedding stays floating point: a lookup reads one row per token, not the matrix).
    Embeddings, norms and anything that is not an ``nn.Linear`` (MoE expert banks) keep their
    dtype.

    It warns where the layers' dtype (their activations') is one this CPU's int8 kernel runs
    slowly (:func:`kernel_dtypes`: fp32 or fp16 on x86).

    Args:
        skip: names of modules (as in ``named_modules``) to leave in floating point.
    """
    targets = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and name not in skip
    ]
    fast = kernel_dtypes()
    slow = {
        lin.weight.dtype
        for _, lin in targets
        if lin.weight.device.type == "cpu" and lin.weight.dtype not in fast
    }
    if slow and _kernel_available():
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in slow))
        logging.getLogger(__name__).warning(
            "int8 weights with %s activations: on this CPU (%s) torch's int8 kernel is "
            "vectorised for bf16 activations only, so prompts and batches take a slower portable "
            "form (on CPUs without AVX-512, decoding steps prepared by "
            "attnlab.fast.for_decoding, as attnlab generate does, take attnlab's own int8 "
            "kernel); bf16 activations (--dtype bfloat16) are fastest",
            names,
            torch.backends.cpu.get_cpu_capability(),
        )
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, Int8Linear.from_linear(linear))
    return model
