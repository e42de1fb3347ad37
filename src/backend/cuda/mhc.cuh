// Manifold-constrained hyper-connections (engine/mhc) on the GPU: the mix projection, the
// sigmoid / Sinkhorn split, and the collapse / expand of the hc residual streams. Each follows
// the host's fp32 steps in the host's order (sums sequential, no FMA); the only differences are
// the fp64 dot products' summation order and exp (fp64 on the GPU, glibc expf on the host).
// All arrays are device arrays; shapes as engine/mhc.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// m[s, j] = rms(X[s]) . fn[j] over the flattened streams X [S, flat], fn [n_out, flat]; dot
// products and sums of squares in fp64 over exact fp32 products, in an order fixed by flat
// (mhc.cu; with fold_after, S of 128 or more takes another kernel and order, the fp64 tensor
// cores'), rounded once: bit-equal to engine::hc_project except where an exact sum sits within
// ~2^-29 relative of an fp32 rounding boundary. fold_after: the reference's order
// (product, then times 1 / sqrt(float(float(sum X^2) / flat) + eps)); otherwise transformers'
// (normalize X in fp32 first). m: [S, n_out]. S <= 262140.
Status hc_project(const float *X, int64_t S, int64_t flat, const float *fn, int64_t n_out, float eps, bool fold_after,
                  float *m, cudaStream_t stream);

// pre, post [S, hc] and comb [S, hc, hc] from m [S, (2 + hc) * hc], scale [3], base
// [(2 + hc) * hc]: engine hc_split_sinkhorn, one warp (hc 2, 4) or thread per token. hc <= 8.
// An output passed as null is not computed (at least one is needed): pre and post are a
// sigmoid each, comb is the 2 x iters normalizations, so a caller that needs pre at once can
// have it alone and the rest on another stream.
Status hc_split_sinkhorn(const float *m, int64_t S, int hc, const float *scale, const float *base, float eps, int iters,
                         float *pre, float *post, float *comb, cudaStream_t stream);

// pre [S, hc] alone from m (row stride ld >= hc), scale [1], base [hc]: hc_split_sinkhorn's pre
// arithmetic for a site that projects its pre mixes only (V4's hc_head), so the step needs no
// host round trip there.
Status hc_pre(const float *m, int64_t S, int hc, int64_t ld, const float *scale, const float *base, float eps, float *pre,
              cudaStream_t stream);

// x[s, d] = sum_j pre[s, j] X[s, j, d] (j ascending, fp32). round_bf16: OFFICIAL's bf16 x.
Status hc_collapse(const float *X, const float *pre, int64_t S, int hc, int64_t D, bool round_bf16, float *x,
                   cudaStream_t stream);

// X[s, k, d] = post[s, k] y[s, d] + sum_j comb[s, j, k] X[s, j, d] (the old X; j ascending).
// In place. round_bf16: OFFICIAL's bf16 streams.
Status hc_expand(float *X, const float *y, const float *post, const float *comb, int64_t S, int hc, int64_t D,
                 bool round_bf16, cudaStream_t stream);
// hc_expand of y = a + b (fp32, then bf16 when round_bf16: add_rows' bits), in one launch: a
// sublayer's two outputs (routed and shared experts) go into the streams without their sum
// being written first.
Status hc_expand_sum(float *X, const float *a, const float *b, const float *post, const float *comb, int64_t S, int hc,
                     int64_t D, bool round_bf16, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
