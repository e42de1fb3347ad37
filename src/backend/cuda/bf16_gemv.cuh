// Decode GEMV over plain BF16 weights on the tensor cores: the LM head (129280 x 5120) and other
// wide BF16 products at decode batch sizes, where dense_linear's fp32 FMAs become the limit
// (V4.1's head at M 16: 1.73 ms of a C16 step, ~12 TFLOP/s, H200 ncu 2026-12-02; here 0.54 ms,
// and 0.42 ms at M 1 .. 8: 3.15 TB/s, where dense_linear streams M 1 at 4.1 TB/s).
//
// y[m, n] = sum_k x[m, k] * w[n, k]: x fp32, taken exactly as three BF16 pieces (hi + mid + lo),
// so every product is exact; sums in fp32 on the tensor cores in one order per output that
// depends on K alone (not on M, the other rows, or which warp runs it): a row gives the same bits
// at any M <= 16. Another order than dense_linear's: results agree within fp32 summation error.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

constexpr int BF16_GEMV_MAX_M = 16;

// Workspace for x's pieces: M * K * 6 bytes (256-byte aligned use).
size_t bf16_gemv_workspace_bytes(int M, int K);

// w: [N, K] bf16 bits, 16-byte aligned; x: [M, K] fp32, 16-byte aligned; y: [M, N] (no alias).
// 1 <= M <= 16, K a multiple of 32. Graph-capturable.
Status bf16_gemv(const float *x, const uint16_t *w, float *y, int M, int N, int K, void *workspace, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
