"""Int8 weights against a few rows of bf16 activations on CPUs with AVX-512 BF16.

A speculative verification of k + 1 tokens multiplies every weight by k + 1 rows. torch's
``_weight_int8pack_mm`` costs about k + 1 one-row products there (on a 2-core AVX-512 EPYC,
torch 2.13, one thread, a 2048 × 512 layer: 0.06 ms for one row, 0.51 ms for 17), so a
verification gains little over k + 1 plain steps. This kernel converts each 32 int8 weights
to bf16 once (exact: ``|q| ≤ 127`` has at most seven significant bits) and multiplies them by
every row of x with the CPU's bf16 pair product (``vdpbf16ps``: pairs of bf16 products
added into fp32 lanes): level with torch's kernel for one row with the weights in cache, 1.4–1.8×
it from 5 to 33 rows on that machine. Inside a decoding step the weights stream from memory; a
prefetch of the rows two groups ahead keeps a one-row product there at 65–80 µs a call (the
4 × 512 int8 benchmark model of benchmarks/speculative.py, averaged over its layers) against
torch's 87–117 µs, where without it the kernel took 116 µs.

Every (row of x, weight row) sum is one chain over K in steps of 32 and the same reduction,
whatever rows are computed beside it, so a verification gives each token bit for bit what a
one-token step gives it (greedy speculative decoding stays identical to plain decoding). The
sum is multiplied by the row's scale and the bias added in fp32, then rounded to bf16 once.

More rows (a prompt, beyond :data:`ROWS_INT8_BF16`) take oneDNN's bf16 product of the
weights converted to bf16, 2.4× torch's int8 kernel at 96 rows there (the scale is applied to
the bf16 product). :class:`~attnlab.fast.quant.Int8Linear` takes both paths once
:func:`~attnlab.fast.matvec.use_matvec` (``attnlab.fast.for_decoding``) has prepared it, on a
CPU whose flags include ``avx512_bf16``; elsewhere nothing here is built or called. The kernel is
built the first time it is needed (torch's C++ extension loader, some seconds, cached on disk);
where it cannot be built it is off, with one logged warning. ``ATTNLAB_MATVEC=0`` turns it off
with the other kernels.

Shape legend: N output features (weight rows), K input features (a multiple of 32), M rows of x.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from attnlab.fast.kernel_build import clear_stale_lock, cpu_flags, put_ninja_on_path

__all__ = ["ROWS_INT8_BF16", "cpu_has_avx512_bf16", "int8_bf16_available", "int8_bf16_rows"]

log = logging.getLogger(__name__)

#: the most rows an int8 layer with bf16 activations sends to the kernel; more take oneDNN's
#: bf16 product of the converted weights (the kernel is level with it at 33 rows of a
#: 2048 × 512 layer, behind at 64)
ROWS_INT8_BF16 = 32

_SOURCE = r"""
// the few ATen headers the kernel needs (see attnlab.fast.matvec)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <vector>

namespace {

// 32 int8 weights -> 32 bf16, exact (|q| <= 127 has at most 7 significant bits)
inline __m512bh widen32(const int8_t* p) {
  __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);  // elements 0-15 from lo, 16-31 from hi
}

inline __m512bh load32(const uint16_t* p) {
  return (__m512bh)_mm512_loadu_si512(reinterpret_cast<const void*>(p));
}

// sums[r][g] = x_r · q_g over K (K a multiple of 32): one chain of bf16 pair products per
// (r, g), in the same order whatever R and G, and whether the weights come converted (wb)
template <int R, int G>
inline void tile(const __m512bh* wb, const int8_t* wq, int64_t K, const uint16_t* x,
                 float sums[R][G]) {
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  const int64_t C = K / 32;
  for (int64_t c = 0; c < C; ++c) {
    if (!wb && (c & 1) == 0) {
      // the weights stream from memory once: ask for the rows two groups ahead (harmless past
      // the end: a prefetch does not fault)
      for (int g = 0; g < G; ++g)
        _mm_prefetch(reinterpret_cast<const char*>(wq + (2 * G + g) * K + c * 32), _MM_HINT_T0);
    }
    __m512bh w[G];
    for (int g = 0; g < G; ++g) w[g] = wb ? wb[g * C + c] : widen32(wq + g * K + c * 32);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = load32(x + r * K + c * 32);
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], xv, w[g]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) sums[r][g] = _mm512_reduce_add_ps(acc[r][g]);
}

// a bf16 value as fp32 (the bits shifted up by 16)
inline float from_bf16(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// the scales and the bias in the activations' dtype (bf16), as the layer keeps them for bf16
// models, or fp32
struct Vec {
  const uint16_t* h = nullptr;
  const float* f = nullptr;
  float operator[](int64_t i) const { return h ? from_bf16(h[i]) : f[i]; }
  explicit operator bool() const { return h || f; }
};

template <int R, int G>
inline void put(const __m512bh* wb, const int8_t* wq, int64_t K, const uint16_t* x,
                const Vec& s, const Vec& b, at::BFloat16* o, int64_t N, int64_t n) {
  float sums[R][G];
  tile<R, G>(wb, wq, K, x, sums);
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      float y = sums[r][g] * s[n + g];
      if (b) y = y + b[n + g];
      o[r * N + n + g] = at::BFloat16(y);  // rounded to nearest even, once
    }
}

// the rows of x (M, K) against G weight rows starting at n
template <int G>
void group(const int8_t* w, const uint16_t* x, const Vec& s, const Vec& b, at::BFloat16* o,
           int64_t M, int64_t N, int64_t K, int64_t n, std::vector<__m512bh>& buf) {
  const int8_t* wq = w + n * K;
  const __m512bh* wb = nullptr;
  if (M > 4) {  // convert the group once, reuse it for every block of rows
    const int64_t C = K / 32;
    buf.resize(G * C);
    for (int g = 0; g < G; ++g)
      for (int64_t c = 0; c < C; ++c) {
        if ((c & 1) == 0)  // as in tile: the rows two groups ahead
          _mm_prefetch(reinterpret_cast<const char*>(wq + (2 * G + g) * K + c * 32), _MM_HINT_T0);
        buf[g * C + c] = widen32(wq + g * K + c * 32);
      }
    wb = buf.data();
  }
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) put<4, G>(wb, wq, K, x + m * K, s, b, o + m * N, N, n);
  const int64_t left = M - m;
  const uint16_t* xm = x + m * K;
  at::BFloat16* om = o + m * N;
  if (left == 3) put<3, G>(wb, wq, K, xm, s, b, om, N, n);
  if (left == 2) put<2, G>(wb, wq, K, xm, s, b, om, N, n);
  if (left == 1) put<1, G>(wb, wq, K, xm, s, b, om, N, n);
}

// a vector of scales or biases as it is (bf16, fp32) or converted to fp32; keep holds it
Vec as_vec(const at::Tensor& v, at::Tensor& keep) {
  Vec out;
  if (v.scalar_type() == at::kBFloat16) {
    keep = v.contiguous();
    out.h = reinterpret_cast<const uint16_t*>(keep.data_ptr<at::BFloat16>());
  } else {
    keep = v.to(at::kFloat).contiguous();
    out.f = keep.data_ptr<float>();
  }
  return out;
}

}  // namespace

at::Tensor int8_rows_bf16(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                          const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar,
              "attnlab_bf16::int8_rows: weight must be an int8 matrix");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(K % 32 == 0, "attnlab_bf16::int8_rows: K must be a multiple of 32, got ", K);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() >= 1 && x.size(-1) == K,
              "attnlab_bf16::int8_rows: x must be bf16 rows of width ", K);
  TORCH_CHECK(scale.numel() == N, "attnlab_bf16::int8_rows: one scale per weight row");
  const int64_t M = x.numel() / K;
  auto w = weight.contiguous();
  auto xc = x.contiguous();
  at::Tensor sk, bk;
  const Vec sp = as_vec(scale, sk);
  const Vec b = bias.has_value() && bias->defined() ? as_vec(*bias, bk) : Vec{};
  TORCH_CHECK(!b || bk.numel() == N, "attnlab_bf16::int8_rows: one bias per weight row");
  auto out = at::empty({M, N}, xc.options());  // bf16
  const int8_t* wp = w.data_ptr<int8_t>();
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const int64_t groups = N / 4;
  at::parallel_for(0, groups, 16, [&](int64_t lo, int64_t hi) {
    std::vector<__m512bh> buf;
    for (int64_t i = lo; i < hi; ++i) group<4>(wp, xp, sp, b, op, M, N, K, 4 * i, buf);
  });
  std::vector<__m512bh> buf;
  for (int64_t n = groups * 4; n < N; ++n) group<1>(wp, xp, sp, b, op, M, N, K, n, buf);
  auto shape = x.sizes().vec();
  shape.back() = N;
  return out.view(shape);
}

TORCH_LIBRARY(attnlab_bf16, m) {
  m.def("int8_rows(Tensor x, Tensor weight, Tensor scale, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab_bf16, CPU, m) { m.impl("int8_rows", &int8_rows_bf16); }
"""

#: bump when the C++ source changes (the build is cached on disk under this name)
_EXT_NAME = "attnlab_int8_bf16_v4"


@functools.cache
def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU's flags (``/proc/cpuinfo``) include AVX-512 F, BW and BF16."""
    return {"avx512f", "avx512bw", "avx512_bf16"} <= cpu_flags()


@functools.cache
def _extension():
    """The kernel's operator (``torch.ops.attnlab_bf16.int8_rows``), or None where it cannot be
    built (logged once)."""
    if os.environ.get("ATTNLAB_MATVEC", "1") == "0" or not cpu_has_avx512_bf16():
        return None
    try:
        # lazy: the build (torch's extension loader) runs only when a fast path asks
        from torch.utils.cpp_extension import _get_build_directory, load_inline

        put_ninja_on_path()
        build_dir = _get_build_directory(_EXT_NAME, verbose=False)
        clear_stale_lock(os.path.join(build_dir, "lock"))
        if not os.path.exists(os.path.join(build_dir, f"{_EXT_NAME}.so")):
            print(
                "attnlab: building the int8 x bf16 CPU kernel (once, some seconds)",
                file=sys.stderr,
                flush=True,
            )
        load_inline(
            _EXT_NAME,
            cpp_sources=_SOURCE,
            extra_cflags=[
                "-O3",
                "-mavx512f",
                "-mavx512bw",
                "-mavx512vl",
                "-mavx512bf16",
                "-ffp-contract=off",
                "-fopenmp",
            ],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            no_implicit_headers=True,
            verbose=False,
        )
        _register_fake()
        return torch.ops.attnlab_bf16.int8_rows.default
    except Exception as err:  # no compiler, or one without AVX-512 BF16: torch's kernel instead
        log.warning("attnlab: the int8 x bf16 CPU kernel could not be built (%s)", err)
        return None


def int8_bf16_available() -> bool:
    """True when :func:`int8_bf16_rows` runs the kernel (builds it on the first call)."""
    return _extension() is not None


# a constant in a compiled graph, as attnlab.fast.matvec.matvec_available
int8_bf16_available._dynamo_marked_constant = True  # type: ignore[attr-defined]


@functools.cache
def _register_fake() -> None:
    @torch.library.register_fake("attnlab_bf16::int8_rows")
    def _(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
        return x.new_empty(*x.shape[:-1], weight.shape[0])

    @register_flop_formula([torch.ops.attnlab_bf16.int8_rows])
    def _flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        rows = 1
        for d in x_shape[:-1]:
            rows *= d
        return 2 * rows * w_shape[0] * w_shape[1]


def takes_kernel(x: Tensor) -> bool:
    """Whether an int8 layer's product of ``x`` goes to the kernel: a CPU, bf16 activations,
    K a multiple of 32, at most :data:`ROWS_INT8_BF16` rows, no gradient, the kernel built."""
    K = x.shape[-1]
    return (
        x.device.type == "cpu"
        and x.dtype == torch.bfloat16
        and K > 0
        and K % 32 == 0
        and x.numel() // K <= ROWS_INT8_BF16
        and not (torch.is_grad_enabled() and x.requires_grad)
        and int8_bf16_available()
    )


def int8_bf16_rows(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, scale[:, None] · weight, bias)`` for bf16 rows ``x (..., K)``, int8
    weights ``(N, K)`` and one scale per row ``(N,)``, through the kernel (bf16 out); K must be
    a multiple of 32. Raises where the kernel is not available (:func:`int8_bf16_available`)."""
    if weight.dtype != torch.int8 or weight.dim() != 2 or scale.shape != (weight.shape[0],):
        raise ValueError(
            f"int8_bf16_rows takes an int8 weight (N, K) and N scales, got a {weight.dtype} "
            f"weight of shape {tuple(weight.shape)} and scales of shape {tuple(scale.shape)}"
        )
    K = weight.shape[1]
    if x.dtype != torch.bfloat16 or x.dim() == 0 or x.shape[-1] != K or K % 32:
        raise ValueError(
            f"int8_bf16_rows takes bf16 rows of width K = {K} (a multiple of 32), got a "
            f"{x.dtype} x of shape {tuple(x.shape)}"
        )
    if _extension() is None:
        raise RuntimeError(
            "the int8 x bf16 kernel is not available on this machine (it needs AVX-512 BF16 "
            "and a C++ compiler that targets it)"
        )
    return torch.ops.attnlab_bf16.int8_rows(x, weight, scale, bias)
