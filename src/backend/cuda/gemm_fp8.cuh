// Prefill-shaped matrix product in the official numerics of V4.1 / V4, on the FP8 tensor cores:
// many activation rows (a prompt chunk, M in the hundreds or thousands) against one quantized
// weight as the checkpoint stores it. Bound by the tensor cores, not by the weight bytes.
//
// y[m, n] = sum_k xq[m, k] * dequant(W)[n, k], where xq is x quantized to E4M3 per act_block
// channels with power-of-two scales (backend/cpu fake_quant_fp8_ue8m0). Matches backend/cpu
// matmul_nt of the fake-quantized x against the dequantized weight within 1e-5 relative (the
// products are exact; only the fp32 summation order differs). Row m's output does not depend on
// M or on the other rows (no split K; each output sums its k in one fixed order).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/device_info.h"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// Which kernel runs: AUTO takes the wgmma one (gemm_fp8_sm90.cu) where it can run (sm_90a code, a
// cc 9.0 device, DS41RT_GEMM_WGMMA not 0), else mma.sync. Tests and A/B runs name one.
enum class gemm_fp8_kernel { AUTO, MMA_SYNC, WGMMA };

struct gemm_fp8_args {
    const float *x = nullptr;  // [M, K] fp32, 16-byte aligned
    int M = 0, K = 0;          // K a multiple of 32 and of act_block
    int act_block = 32;        // 32 (V4.1) or 128 (V4): channels per activation scale
    const uint8_t *w = nullptr;      // FP8: [N, K] e4m3. MXFP4: [N, K/2] e2m1, low nibble = even k. 16-byte aligned
    const uint8_t *scale = nullptr;  // FP8: [ceil(N/block_out), ceil(K/block_in)] e8m0. MXFP4: [N, K/32] e8m0
    bool fp4 = false;
    int N = 0;
    int block_out = 32, block_in = 32;  // FP8 scale grid (V4.1 32x32, V4 128x128): multiples of 32
    float *y = nullptr;                 // [M, N]; must not alias x, w or the workspace
    gemm_fp8_kernel kernel = gemm_fp8_kernel::AUTO;
    // x as it is, not fake-quantized (official numerics' BF16 class over an FP8 weight): the products
    // exact from x's three BF16 pieces (hi + mid + lo). The wgmma kernel only.
    bool exact_x = false;
    // w is plain BF16 [N, K] (a BF16-class weight the checkpoint stores unquantized; scale, fp4 and
    // the blocks unused), with exact_x: every product exact. The wgmma kernel only.
    bool bf16_weight = false;
    bool round_bf16 = false;  // y stored rounded to bf16 (OFFICIAL's output rounding), both kernels
};

// Many weights of one shape, each over its own rows of x (a prefill's routed experts: rows sorted
// by expert, w1 and w3 over the same rows). Same numerics and invariants as gemm_fp8_args.
struct gemm_fp8_group {
    int64_t row0 = 0, rows = 0;                    // x rows [row0, row0 + rows)
    const uint8_t *w = nullptr, *scale = nullptr;  // as gemm_fp8_args; w 16-byte aligned
    float *y = nullptr;                            // [rows, N]
};
struct gemm_fp8_grouped_args {
    const float *x = nullptr;  // [R, K] fp32, 16-byte aligned
    int64_t R = 0;
    int K = 0, act_block = 32, N = 0;
    bool fp4 = false;
    int block_out = 32, block_in = 32;
    bool round_bf16 = false;  // y stored rounded to bf16 (OFFICIAL's output rounding)
    bool exact_x = false;     // as gemm_fp8_args::exact_x; one group only
    bool bf16_weight = false;  // as gemm_fp8_args::bf16_weight; one group only
    std::vector<gemm_fp8_group> groups;
};

// True when `k` can run on `dev` in this build (AUTO and MMA_SYNC always).
bool gemm_fp8_kernel_usable(const device_info &dev, gemm_fp8_kernel k);

// Device memory run_gemm_fp8 needs for these arguments, whichever kernel runs (quantized or
// dequantized x, the weight's scales or the weight decoded). No zeroing needed.
size_t gemm_fp8_workspace_bytes(const gemm_fp8_args &a);

// NOT_SUPPORTED for shapes outside the contract above, a device without the shared memory the
// tiles need, or a named kernel that cannot run here; INVALID_ARGUMENT for null or misaligned
// pointers. Graph-capturable.
Status run_gemm_fp8(const device_info &dev, const gemm_fp8_args &a, void *workspace, cudaStream_t stream);

// The grouped product, on the wgmma kernel only (NOT_SUPPORTED where it cannot run: callers keep
// another path). Its workspace holds x's operand image and the groups' tables, copied from the
// host by the call (no host buffer outlives it).
size_t gemm_fp8_grouped_workspace_bytes(const gemm_fp8_grouped_args &a);
Status run_gemm_fp8_grouped(const device_info &dev, const gemm_fp8_grouped_args &a, void *workspace, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
