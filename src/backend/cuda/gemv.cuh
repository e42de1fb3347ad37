// Decode-shaped matrix-vector products over the checkpoint's own weight formats: a few
// activation rows against a large quantized weight, bound by the weight bytes streamed.
//
// y[m, n] = sum_k x[m, k] * dequant(W)[n, k], fp32 activations and accumulation; matches
// backend/cpu matmul_nt on the dequantized weight within fp32 summation-order differences.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_info.h"
#include "core/status.h"

namespace ds41rt::backend::cuda {

struct gemv_params {
    const uint8_t *w = nullptr;      // FP8: [N, K] e4m3. MXFP4: [N, K/2] e2m1, low nibble = even k
    const uint8_t *scale = nullptr;  // FP8: [ceil(N/block_out), ceil(K/block_in)] e8m0. MXFP4: [N, K/32]
    const float *x = nullptr;        // [M, K]
    float *y = nullptr;              // [M, N]
    int M = 1, N = 0, K = 0;
    int block_out = 32, block_in = 32;  // FP8 scale grid (V4.1 32x32, V4 128x128)
};

// FP8 E4M3 weight with E8M0 block scales. Needs K % 16 == 0 and block_in % 16 == 0.
Status gemv_fp8_block(const device_info &dev, const gemv_params &p, cudaStream_t stream);
// MXFP4 weight (E2M1 + E8M0 per 32 along K). Needs K % 32 == 0.
Status gemv_mxfp4(const device_info &dev, const gemv_params &p, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
