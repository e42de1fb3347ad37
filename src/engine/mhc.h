// Manifold-constrained hyper-connections (mHC), shared by V4 (spec V4 3.3) and V4.1 (spec 4.2):
// the residual is hc parallel streams; each site projects the flattened streams to 2*hc + hc*hc
// mixes and splits them into pre (collapse weights), post (output placement) and comb (a
// Sinkhorn-normalized hc x hc stream mixer). The numerics are plain fp32 here; the callers round
// the streams to bf16 where OFFICIAL numerics require it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ds41rt::engine {

struct hc_mixes {
    std::vector<float> pre, post, comb;  // [S, hc], [S, hc], [S, hc, hc] (comb[j][k])
};

// m[s, :] = rms(X[s]) . fn^T over the flattened streams X [S, hc * D], fn [n_out, hc * D].
// fold_after: the reference's order (GEMV first, then times rsqrt(mean(X^2) + eps));
// otherwise transformers' (normalize X, then GEMV). Equal in exact arithmetic.
void hc_project(const float *X, int64_t S, int64_t flat, const Tensor &fn, int64_t n_out, float eps, bool fold_after,
                float *m);

// pre = sigmoid(m * scale[0] + base) + eps; post = 2 sigmoid(m * scale[1] + base);
// comb = softmax_row(m * scale[2] + base) + eps, column-normalized, then iters - 1 times (row,
// column) normalized, eps in every denominator. m: [S, (2 + hc) * hc].
hc_mixes hc_split_sinkhorn(const float *m, int64_t S, int hc, const float *scale, const float *base, float eps,
                           int iters);

// x[s] = sum_j pre[s, j] * X[s, j]. X: [S, hc, D], x: [S, D].
void hc_collapse(const float *X, const float *pre, int64_t S, int hc, int64_t D, float *x);

// X[s, k] = post[s, k] * y[s] + sum_j comb[s, j, k] * X[s, j] (sum over the FIRST index).
void hc_expand(float *X, const float *y, const hc_mixes &mx, int64_t S, int hc, int64_t D);

}  // namespace ds41rt::engine
