// Matrix products over plain float weights (BF16 or F32 as the checkpoint stores them): the
// model's F32-class and BF16-class linears (gate, head, compressor, indexer key and weight
// projections, Engram q / k), which the FP8 / MXFP4 GEMV does not cover.
//
// y[m, n] = sum_k x[m, k] * w[n, k], fp32 products and sums (fmaf). The summation order of an
// output is fixed by K alone, never by M, N, pointer alignment or how rows are split, so a row
// computed in a prefill equals the same row in a decode bit for bit:
//   K is cut into chunks of 8 consecutive k; chunk c belongs to part c % 8; each part sums its
//   chunks in ascending c, the 8 products of a chunk in ascending k, into one accumulator from
//   +0; the 8 part sums p0..p7 are combined as a butterfly: q_i = p_i + p_{i^4}, r_i = q_i +
//   q_{i^2}, y = r_0 + r_1.
// Against backend/cpu matmul_nt (fp64 sums rounded once): parts of K / 8 sequential fp32 terms,
// about 1e-6 relative for typical outputs; tests bound |d| by 1e-6 |y| + 5e-7 sum_k |x_k w_k|.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// w: [N, K] device, bf16 bits when w_bf16, else fp32. x: [M, K], y: [M, N] device (y must not
// alias x). Any M >= 1, K >= 1; 16-byte vector loads when K % 8 == 0 and x, w are 16-byte aligned.
Status dense_linear(const float *x, const void *w, bool w_bf16, float *y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t stream);

// Two products of one x (w1 [N1, K] -> y1, w2 [N2, K] -> y2, both bf16 or both fp32): each y the
// bits dense_linear gives it alone. Narrow ones (the compressor's kv and gate at decode) share
// one launch, whose blocks are the two products' (one launch's latency instead of two in a row);
// others are two dense_linear calls.
Status dense_linear_pair(const float *x, const void *w1, float *y1, int64_t N1, const void *w2, float *y2, int64_t N2,
                         bool w_bf16, int64_t M, int64_t K, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
