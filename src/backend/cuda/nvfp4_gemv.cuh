// Decode-shaped W4A4 products over NVIDIA ModelOpt NVFP4 weights as published (spec quant-formats
// 1.3): a few activation rows (1..16 tokens) against the packed E2M1 codes with their E4M3 per-16
// scales, several matrices per launch (the selected experts of a layer), no repacked copy.
//
// y[m, n] = sum_k xq[m, k] * w[n, k], where w = e2m1 * e4m3 scale * weight_scale_2 (model/nvfp4)
// and xq is the activation after NVFP4 fake quantization with the matrix's input_scale, computed
// on the device from the fp32 rows exactly as backend/cpu nvfp4_fake_quant_act (out_bf16 = true)
// does. Matches backend/cpu nvfp4_w4a4_linear within 1e-5 relative; nvfp4_gemv.cu says how.
//
// A separate family from gemv.cuh (FP8 / MXFP4): the activation is quantized per 16 channels
// with a global scale and rounded to bf16, the weight scales are E4M3 per 16 (not powers of two),
// and each matrix carries two fp32 scalars, so neither the fragment layout of x nor the scale
// path of gemv's kernel fits; the plan / run split and the split-K bookkeeping follow gemv.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/device_info.h"
#include "core/status.h"

namespace ds41rt::backend::cuda {

struct nvfp4_matrix {
    const uint8_t *w = nullptr;      // [N, K/2] E2M1, low nibble = even k; 16-byte aligned
    const uint8_t *scale = nullptr;  // [N, K/16] E4M3 (weight_scale, plain row-major); 2-byte aligned
    float weight_scale_2 = 0;        // per-tensor weight dequant multiplier, > 0
    float input_scale = 0;           // per-tensor activation dequant multiplier, > 0
    int N = 0, K = 0;                // K a multiple of 32
    const float *x = nullptr;        // [M, K] fp32 rows (bf16 values in the model); 16-byte aligned
    float *y = nullptr;              // [M, N]; must not alias x or w
    int M = 1;                       // 1..16
};

// The launch shape of one batch of matrices, computed on the host once per shape (a decode step
// captured in a graph reuses it). Matrices with the same x, M, K and input_scale (w1 and w3 of
// one expert, checked equal at load) share one quantization of x.
struct nvfp4_gemv_plan {
    std::vector<nvfp4_matrix> mats;
    std::vector<int> ksplit;        // K slices per 16-row tile, per matrix
    std::vector<size_t> x_offset;   // where each matrix's quantized x lives in the workspace
    size_t workspace_bytes = 0;
};

// INVALID_ARGUMENT for missing or misaligned pointers, non-positive or non-finite scalars, or
// matrices sharing x at another shape; NOT_SUPPORTED for M > 16 or K % 32 != 0.
Result<nvfp4_gemv_plan> plan_nvfp4_gemv(const device_info &dev, const std::vector<nvfp4_matrix> &mats);

// workspace: workspace_bytes of device memory, zeroed once when allocated (split-K tile counters
// are left at zero after every run, so replays need no memset).
Status run_nvfp4_gemv(const nvfp4_gemv_plan &plan, void *workspace, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
