// Matrix products over plain float weights (BF16 or F32 as the checkpoint stores them): the
// model's F32-class and BF16-class linears (gate, head, compressor, indexer key and weight
// projections, Engram q / k), which the FP8 / MXFP4 GEMV does not cover.
//
// y[m, n] = sum_k x[m, k] * w[n, k], fp32 products and sums. Each output's summation order is
// fixed by k alone (lane k % 32 takes every 32nd product, then a fixed butterfly), never by M or
// by how rows are split, so a row computed in a prefill equals the same row in a decode.
// Against backend/cpu matmul_nt (fp64 sums rounded once): within ~1e-6 relative for K <= 8192.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// w: [N, K] device, bf16 bits when w_bf16, else fp32. x: [M, K], y: [M, N] device (y must not
// alias x). Any M >= 1, K >= 1.
Status dense_linear(const float *x, const void *w, bool w_bf16, float *y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
