"""Linear layers of one row or a few at the memory limit on a CPU: ``y = x Wᵀ + b``.

Decoding one token at a time multiplies every weight matrix by one vector, so a step costs the
time to read the weights. torch's CPU kernels for that product read bf16 weights at about
11 GB/s and fp32 ones at about 8.5 GB/s on a 2-core AVX2 machine whose plain reduction over the
same bytes runs at 16–19 GB/s. :func:`matvec` is a small C++ kernel (AVX2 + FMA, OpenMP over
rows; built with torch's C++ extension loader the first time it is needed, about 6 s, cached
on disk afterwards) that streams the weights once: bf16 weights are widened to fp32 in
registers (a shift), multiplied by the fp32 vector with four weight rows in flight (four
independent accumulators), and the sum rounded to the layer's dtype once. It reads at 14–16 GB/s where torch's product
reads at 11 (benchmarks/generate.py prints both in its roofline line).

A few rows (a speculative verification of k + 1 tokens, a small batch's decoding step) go
through the same kernel, still reading the weights once: two weight rows at a time against up
to six rows of x (twelve accumulators; a chunk of 64 weight rows stays in cache while the blocks
of x pass over it). Every sum is computed in the same order whatever the rows beside it (one
chain per pair of rows, four weight rows at a time for a single row of x; no FMA contraction
left to the compiler), so each row's result is bit for bit its one-row product: a verification's
linear layers give each token what a one-token step gives it. torch's product of a few rows packs the weights first (MKL's GEMM for fp32,
2–3× a one-row product at 2–5 rows) or, in bf16 without bf16 matrix instructions, is several
times slower still; the kernel takes at most :data:`ROWS_FP32` / :data:`ROWS_BF16` rows, where it
stays ahead.

Int8 weights Q with one scale per row (``W = s Q``, :mod:`~attnlab.fast.quant`) take the same
loops through :func:`int8_matvec` (the operator ``attnlab::int8_matvec``): eight int8 values
become fp32 in registers (exact for ``|q| ≤ 127``), and each row's sum is multiplied by its
scale once. On the 2-core AVX2 EPYC, with bf16 activations, it runs 1.2× torch's
``_weight_int8pack_mm`` for one row and 1.5–2× from 3 to 64 rows (that kernel's cost grows with
the rows faster); torch's kernel has no vectorised AVX2 path for fp32 activations at all, this one
does. An :class:`~attnlab.fast.quant.Int8Linear` takes it for at most :data:`ROWS_INT8` rows
(:data:`ROWS_INT8_FP32` with fp32 activations) once :func:`use_matvec` has been applied, on CPUs
without AVX-512 (:func:`int8_kernel_pays`: with AVX-512 torch's kernel is kept, level with
this one for bf16 activations and faster for prompts; fp32 and fp16 activations take the
portable form there; with AVX-512 BF16, bf16 activations take :mod:`attnlab.fast.int8_bf16`).

:class:`Linear` is ``nn.Linear`` (same parameters, same state-dict names) whose forward takes
this path for one row or a few on a CPU when no gradient is needed, the weight is bf16 or fp32
and the kernel is available; otherwise ``F.linear``. The models are built with plain
``nn.Linear``; :func:`use_matvec` (applied by :func:`attnlab.fast.for_decoding`) turns their
layers into this one, and only then, at the first product it takes, is the kernel built. Inside
``torch.compile`` the kernel is the custom operator ``attnlab::matvec``, which inductor calls
like its own extern kernels. Where the kernel cannot be built (no AVX2/FMA, no C++ compiler or
ninja, another architecture) it is off, with one logged warning, and every product is
``F.linear``'s. ``ATTNLAB_MATVEC=0`` turns it off.

Shape legend: N output features, K input features, M rows of x.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import register_flop_formula

from attnlab.fast.int8_bf16 import cpu_has_avx512_bf16
from attnlab.fast.kernel_build import clear_stale_lock, cpu_flags, put_ninja_on_path

__all__ = [
    "Linear",
    "int8_matvec",
    "matvec",
    "matvec_available",
    "use_matvec",
    "MAX_ROWS",
]

log = logging.getLogger(__name__)

#: the most rows :func:`matvec` takes
MAX_ROWS = 64
#: the most rows :class:`Linear` sends to the kernel, per weight dtype: where it stays faster
#: than torch's product (measured on a 2-core AVX2 EPYC, 2048 × 512 and 512 × 2048 weights:
#: fp32 ahead of MKL up to ~12 rows, bf16 4-5x ahead of torch's bf16 product up to 32)
ROWS_FP32 = 12
ROWS_BF16 = 32
#: the most rows an int8 layer sends to :func:`int8_matvec` (bf16 or fp16 activations; fp32 ones:
#: :data:`ROWS_INT8_FP32`): measured there 1.2-2x torch's ``_weight_int8pack_mm`` from 1 to 64
#: rows with bf16 activations, and ahead of dequantising for MKL's fp32 product up to ~24 rows
ROWS_INT8 = 64
#: ... with fp32 activations: 1.3-2x both torch's int8 product and MKL's of the dequantised
#: weights at 13-24 rows (a verification of 17 tokens), even with them at ~33, behind at 48
#: (2048 x 512, 512 x 2048, 1536 x 512, the same machine)
ROWS_INT8_FP32 = 32
_ROWS_FOR = {torch.float32: ROWS_FP32, torch.bfloat16: ROWS_BF16}

_SOURCE = r"""
// the few ATen headers the kernel needs, not <torch/extension.h> (pybind11 and the whole C++
// API): a quarter of the build time
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cstring>

namespace {

inline __m256 widen(const uint16_t* p) {  // 8 bf16 -> 8 fp32: the bits shifted up by 16
  __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
}

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __m256 load8(const uint16_t* p) { return widen(p); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const int8_t* p) {  // 8 int8 -> 8 fp32 (exact: |q| <= 127)
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
inline float scalar(uint16_t v) { return bf16_to_float(v); }
inline float scalar(float v) { return v; }
inline float scalar(int8_t v) { return static_cast<float>(v); }

inline float hsum(__m256 a) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_hadd_ps(h, h);
  h = _mm_hadd_ps(h, h);
  return _mm_cvtss_f32(h);
}

// x_r · w_j for R rows of x (x + r·K) and W weight rows (w + j·K): each 8 weights loaded (and
// widened) once for all R rows, each 8 of x once for all W weight rows, R·W independent chains.
// Each sum is one chain over k in steps of 8, then the same reduction and the same scalar tail
// whatever R and W, so a row's result does not depend on the rows computed with it: a
// verification of k + 1 tokens gets each token's products bit for bit as a one-token step does
template <int R, int W, typename T>
inline void dots(const T* w, const float* x, int64_t K, float* o) {  // o: [R][W]
  __m256 a[R][W];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) a[r][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wj[W];
    for (int j = 0; j < W; ++j) wj[j] = load8(w + j * K + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xr = _mm256_loadu_ps(x + r * K + k);
      for (int j = 0; j < W; ++j) a[r][j] = _mm256_fmadd_ps(wj[j], xr, a[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) {
      float acc = hsum(a[r][j]);
      for (int64_t i = k; i < K; ++i) acc += scalar(w[j * K + i]) * x[r * K + i];
      o[r * W + j] = acc;
    }
}

// output n of a dot product d: scaled by the row's scale s_n (int8 weights) and biased
inline float finish(float d, const float* s, const float* b, int64_t n) {
  return (s ? s[n] * d : d) + (b ? b[n] : 0.f);
}

// R rows of x against the weight rows lo .. hi, W at a time (4 for one row of x: four chains;
// 2 for more: 2·R chains, at most 12 of the 16 vector registers), the rest one at a time
template <int R, typename T>
inline void block(const T* w, const float* x, const float* s, const float* b, float* o,
                  int64_t N, int64_t K, int64_t lo, int64_t hi) {
  constexpr int W = R == 1 ? 4 : 2;
  float d[R * W];
  int64_t n = lo;
  for (; n + W <= hi; n += W) {
    dots<R, W>(w + n * K, x, K, d);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < W; ++j) o[r * N + n + j] = finish(d[r * W + j], s, b, n + j);
  }
  for (; n < hi; ++n) {
    dots<R, 1>(w + n * K, x, K, d);
    for (int r = 0; r < R; ++r) o[r * N + n] = finish(d[r], s, b, n);
  }
}

// o (M, N) = x (M, K) · Wᵀ (+ b), times s for int8 weights: the rows of x in blocks of up to 6;
// a chunk of 64 weight rows (at most 64 · K values) stays in cache across the blocks, so the
// weights stream from memory once
template <typename T>
void rows(const T* w, const float* x, const float* s, const float* b, float* o, int64_t M,
          int64_t N, int64_t K) {
  at::parallel_for(0, N, 64, [&](int64_t lo0, int64_t hi0) {
    for (int64_t lo = lo0; lo < hi0; lo += 64) {
      const int64_t hi = std::min(lo + 64, hi0);
      int64_t m = 0;
      for (; m + 6 <= M; m += 6) block<6>(w, x + m * K, s, b, o + m * N, N, K, lo, hi);
      const int64_t left = M - m;
      const float* xm = x + m * K;
      float* om = o + m * N;
      if (left == 5) block<5>(w, xm, s, b, om, N, K, lo, hi);
      if (left == 4) block<4>(w, xm, s, b, om, N, K, lo, hi);
      if (left == 3) block<3>(w, xm, s, b, om, N, K, lo, hi);
      if (left == 2) block<2>(w, xm, s, b, om, N, K, lo, hi);
      if (left == 1) block<1>(w, xm, s, b, om, N, K, lo, hi);
    }
  });
}

// an optional float vector (bias, scales) as fp32, or nullptr
const float* as_float(const std::optional<at::Tensor>& v, at::Tensor& keep) {
  if (!v.has_value() || !v->defined()) return nullptr;
  keep = v->to(at::kFloat).contiguous();
  return keep.data_ptr<float>();
}

}  // namespace

// y = x Wᵀ + b for a few rows x (..., K) (any float dtype), W (N, K) bf16, fp32, or int8 Q with
// per-row scales s (W = s Q); products and sums in fp32, the result in x's dtype with x's
// leading dimensions
at::Tensor rows_product(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& scale,
                        const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.dim() == 2, "attnlab::matvec: weight must be a matrix");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "attnlab::matvec: x must be rows of width ", K);
  const int64_t M = K == 0 ? 0 : x.numel() / K;
  auto w = weight.contiguous();
  auto xf = x.to(at::kFloat).contiguous();
  auto out = at::empty({M, N}, xf.options());
  const float* xv = xf.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::Tensor bf, sf;
  const float* b = as_float(bias, bf);
  const float* s = as_float(scale, sf);
  TORCH_CHECK((w.scalar_type() == at::kChar) == (s != nullptr),
              "attnlab::matvec: int8 weights take scales, and only they");
  TORCH_CHECK(!s || sf.numel() == N, "attnlab::int8_matvec: one scale per weight row");
  if (w.scalar_type() == at::kBFloat16) {
    rows(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), xv, s, b, o, M, N, K);
  } else if (w.scalar_type() == at::kChar) {
    rows(w.data_ptr<int8_t>(), xv, s, b, o, M, N, K);
  } else {
    TORCH_CHECK(w.scalar_type() == at::kFloat,
                "attnlab::matvec: weight must be bf16, fp32 or int8");
    rows(w.data_ptr<float>(), xv, s, b, o, M, N, K);
  }
  auto shape = x.sizes().vec();
  shape.back() = N;
  return out.to(x.scalar_type()).view(shape);
}

at::Tensor matvec(const at::Tensor& x, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias) {
  return rows_product(x, weight, std::nullopt, bias);
}

at::Tensor int8_matvec(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const std::optional<at::Tensor>& bias) {
  return rows_product(x, weight, scale, bias);
}

TORCH_LIBRARY(attnlab, m) {
  m.def("matvec(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("int8_matvec(Tensor x, Tensor weight, Tensor scale, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("matvec", &matvec);
  m.impl("int8_matvec", &int8_matvec);
}
"""

#: bump when the C++ source changes (the build is cached on disk under this name)
_EXT_NAME = "attnlab_matvec_v15"


def _cpu_has_avx2_fma() -> bool:
    return {"avx2", "fma"} <= cpu_flags()


@functools.cache
def _extension():
    """The kernel's operator (``torch.ops.attnlab.matvec``), or None where it cannot be built
    (logged once)."""
    if os.environ.get("ATTNLAB_MATVEC", "1") == "0":
        return None
    if not _cpu_has_avx2_fma():
        return None
    try:
        # lazy: the C++ kernel build (torch's extension loader) runs only when a fast path asks
        from torch.utils.cpp_extension import _get_build_directory, load_inline

        put_ninja_on_path()
        build_dir = _get_build_directory(_EXT_NAME, verbose=False)
        clear_stale_lock(os.path.join(build_dir, "lock"))
        built = os.path.join(build_dir, f"{_EXT_NAME}.so")
        if not os.path.exists(built):
            print(
                "attnlab: building the one-row CPU matrix-vector kernel (once, some seconds)",
                file=sys.stderr,
                flush=True,
            )
        load_inline(  # registers torch.ops.attnlab.matvec (C++ dispatch, no Python per call)
            _EXT_NAME,
            cpp_sources=_SOURCE,
            # a * b + c never contracted into an FMA where the compiler chooses: the same sums
            # in every instantiation (a row's result does not depend on the rows beside it)
            extra_cflags=["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            no_implicit_headers=True,  # the source includes what it uses
            verbose=False,
        )
        _register_fake()
        return torch.ops.attnlab.matvec.default
    except Exception as err:  # no compiler, no ninja, no headers: torch's product instead
        log.warning("attnlab: the one-row CPU kernel could not be built (%s); using F.linear", err)
        return None


def matvec_available() -> bool:
    """True when :func:`matvec` runs the C++ kernel (builds it on the first call)."""
    return _extension() is not None


# torch.compiler.assume_constant_result(matvec_available): decided before tracing, a constant in
# the graph. The decorator itself would import torch._dynamo (~1.6 s) in every process that
# imports attnlab's models; all it does is set this mark, and tests/test_fast_paths.py checks that
# the mark is still the decorator's whole effect in the installed torch.
matvec_available._dynamo_marked_constant = True  # type: ignore[attr-defined]


@functools.cache  # once per process: a second registration is refused (the kernel's .so, once
def _register_fake() -> None:  # loaded, stays loaded when _extension's cache is cleared)
    # shapes for torch.compile, and FLOPs for torch.utils.flop_counter (2·N·K, as F.linear)

    @torch.library.register_fake("attnlab::matvec")
    def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return x.new_empty(*x.shape[:-1], weight.shape[0])

    @torch.library.register_fake("attnlab::int8_matvec")
    def _(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
        return x.new_empty(*x.shape[:-1], weight.shape[0])

    @register_flop_formula([torch.ops.attnlab.matvec, torch.ops.attnlab.int8_matvec])
    def _flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        rows = 1
        for d in x_shape[:-1]:
            rows *= d
        return 2 * rows * w_shape[0] * w_shape[1]


def _rows(x: Tensor) -> int:
    return x.numel() // max(x.shape[-1], 1)


def matvec(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for one row ``x (..., K)`` or a few (at most
    :data:`MAX_ROWS` in the leading dimensions) on a CPU, through the kernel of this module;
    the products accumulate in fp32 and the result has ``x``'s dtype."""
    if x.dim() == 0 or x.shape[-1] != weight.shape[1] or not 1 <= _rows(x) <= MAX_ROWS:
        raise ValueError(
            f"matvec takes 1 to {MAX_ROWS} rows of width {weight.shape[1]}, got x of shape "
            f"{tuple(x.shape)}"
        )
    op = _extension()
    return F.linear(x, weight, bias) if op is None else op(x, weight, bias)


def int8_matvec(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, scale[:, None] · weight, bias)`` for int8 weights ``(N, K)`` with one scale
    per row ``(N,)`` and one row ``x (..., K)`` or a few (at most :data:`MAX_ROWS`) on a CPU: the
    int8 values are converted to fp32 in registers (exact), the products accumulate in fp32, each
    sum is scaled once; the result has ``x``'s dtype."""
    if weight.dtype != torch.int8 or scale.shape != (weight.shape[0],):
        raise ValueError(
            f"int8_matvec takes an int8 weight (N, K) and N scales, got a {weight.dtype} weight "
            f"of shape {tuple(weight.shape)} and scales of shape {tuple(scale.shape)}"
        )
    if x.dim() == 0 or x.shape[-1] != weight.shape[1] or not 1 <= _rows(x) <= MAX_ROWS:
        raise ValueError(
            f"int8_matvec takes 1 to {MAX_ROWS} rows of width {weight.shape[1]}, got x of shape "
            f"{tuple(x.shape)}"
        )
    if _extension() is None:
        y = F.linear(x, weight.to(x.dtype)) * scale.to(x.dtype)
        return y if bias is None else y + bias.to(x.dtype)
    return torch.ops.attnlab.int8_matvec(x, weight, scale, bias)


def int8_rows_path(x: Tensor) -> bool:
    """Whether an int8 layer's product of ``x`` goes to :func:`int8_matvec`'s kernel: a CPU, a
    few rows (:data:`ROWS_INT8`; :data:`ROWS_INT8_FP32` for fp32 activations), no gradient,
    the kernel available."""
    limit = ROWS_INT8_FP32 if x.dtype == torch.float32 else ROWS_INT8
    return (
        x.device.type == "cpu"
        and x.shape[-1] > 0
        and _rows(x) <= limit
        and not (torch.is_grad_enabled() and x.requires_grad)
        and matvec_available()
    )


def _few_rows_path(x: Tensor, weight: Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.shape[-1] > 0
        and _rows(x) <= _ROWS_FOR.get(weight.dtype, 0)
        and x.dtype == weight.dtype
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and matvec_available()
    )


class Linear(nn.Linear):
    """``nn.Linear`` whose products of one row or a few on a CPU (a decoding step, a speculative
    verification, a small batch's step) run through :func:`matvec`; the same parameters,
    state-dict names and results (up to the order of the fp32 additions). Gradients, more rows
    (:data:`ROWS_FP32`, :data:`ROWS_BF16`), other devices and dtypes go through ``F.linear``."""

    def forward(self, x: Tensor) -> Tensor:
        if _few_rows_path(x, self.weight):
            return torch.ops.attnlab.matvec(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_matvec(model: nn.Module) -> nn.Module:
    """Turn every plain ``nn.Linear`` of ``model`` into a :class:`Linear` (in place: the class
    of each layer changes, its parameters, ties, hooks and state-dict names stay) and let every
    :class:`~attnlab.fast.quant.Int8Linear` take :func:`int8_matvec` for a few rows (CPUs
    without AVX-512, :func:`int8_kernel_pays`) or, with bf16 activations on CPUs with AVX-512
    BF16, :mod:`attnlab.fast.int8_bf16` (:func:`int8_bf16_pays`); returns ``model``. Nothing is
    built here: a kernel is built at the first product that takes it."""
    for mod in model.modules():
        if type(mod) is nn.Linear:
            mod.__class__ = Linear
        elif hasattr(mod, "few_rows_kernel"):  # an Int8Linear (quant imports this module)
            mod.few_rows_kernel = int8_kernel_pays()
            mod.bf16_kernel = int8_bf16_pays()
    return model


def int8_bf16_pays() -> bool:
    """Whether int8 layers with bf16 activations take :mod:`attnlab.fast.int8_bf16` (its
    AVX-512 BF16 kernel for a few rows, oneDNN's bf16 product for a prompt): on CPUs with
    AVX-512 BF16, unless ``ATTNLAB_MATVEC=0``. Nothing is built here."""
    return os.environ.get("ATTNLAB_MATVEC", "1") != "0" and cpu_has_avx512_bf16()


def int8_kernel_pays() -> bool:
    """Whether int8 layers take :func:`int8_matvec` for a few rows: on CPUs without AVX-512,
    where it was measured ahead of torch's ``_weight_int8pack_mm`` (which is vectorised there
    for bf16 activations only). With AVX-512 (an EPYC, torch 2.13, one thread, 512-2048 wide
    weights) torch's kernel with bf16 activations is level with this one (0.9-1.1× from 1 to
    33 rows) and ahead of MKL's product of the dequantised weights for a prompt (2.5× at 96
    rows), so torch's is kept there; fp32 and fp16 activations take the portable form
    (:func:`attnlab.fast.quant.kernel_dtypes`)."""
    return not torch.backends.cpu.get_cpu_capability().startswith("AVX512")
