// Decode-shaped matrix products over the checkpoint's own weight formats: a few activation rows
// (the decode batch, 1..16 tokens) against large quantized weights, bound by the weight bytes
// streamed. Several matrices go into one launch (projections that share an input, the selected
// experts of a layer), so small matrices do not each pay a kernel's ramp and tail.
//
// y[m, n] = sum_k x[m, k] * dequant(W)[n, k], fp32 accumulation; matches backend/cpu matmul_nt
// on the dequantized weight (after fake_quant_fp8_ue8m0 of x in official numerics) within 1e-5
// relative; see gemv.cu for how x enters the tensor cores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/device_info.h"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// x already split for official numerics (M <= 16, act_block 32 or 128): xs [M, K] E4M3 codes,
// sx [K / 32, 16] fp32 power-of-two scales, sx[kb * 16 + m] the scale of row m's activation
// block around 32-k block kb: what run_gemv's own split would leave (backend/cpu
// fake_quant_fp8_ue8m0's values), made by the kernel that produces x (hc_collapse_norm) so the
// GEMV launch needs no split kernel before it.
struct gemv_split {
    uint8_t *xs = nullptr;
    float *sx = nullptr;
};

struct gemv_matrix {
    const uint8_t *w = nullptr;      // FP8: [N, K] e4m3. MXFP4: [N, K/2] e2m1, low nibble = even k
    const uint8_t *scale = nullptr;  // FP8: [ceil(N/block_out), ceil(K/block_in)] e8m0. MXFP4: [N, K/32]
    bool fp4 = false;
    int block_out = 32, block_in = 32;  // FP8 scale grid (V4.1 32x32, V4 128x128); multiples of 16 / 32
    int N = 0, K = 0;                   // K a multiple of 32
    const float *x = nullptr;           // [M, K], |x| < 65504
    // 0: reference numerics (x as is). 32 or 128: official numerics, x quantized to E4M3 per
    // act_block channels with power-of-two scales first (backend/cpu fake_quant_fp8_ue8m0); for
    // FP8 weights it must equal block_in.
    int act_block = 0;
    gemv_split split;                   // official numerics: x's split, if made already (xs set)
    float *y = nullptr;                 // [M, N]; must not alias x or w
    int M = 1;                          // 1..16
    // Row strides in elements (0: K for x, N for y): x rows and y rows inside wider rows, e.g. one
    // group's columns of a grouped projection, with no gather or scatter copy. ldx % 4 == 0.
    int ldx = 0, ldy = 0;
    // Official numerics' bf16 linear outputs: y is written already rounded to bf16 (nearest even,
    // the bits round_bf16_inplace would give), saving that launch and its pass over y.
    bool round_bf16_out = false;
};

// Launch-shape tunables (ds41rt_cuda_bench gemv-sweep measures them at the decode shapes, one
// launch at a time). The member initializers are the kept default; changing one of them is the
// whole switch. For measuring a whole decode step, gemv_default_tuning() is them with
// DS41RT_GEMV_WAVES, DS41RT_GEMV_FP4_WAVES, DS41RT_GEMV_MIN_KB and DS41RT_GEMV_BLOCKS_PER_SM
// applied (read once a process): the tuning of every plan that takes the default, the routed
// experts' and run_moe_decode's K slicing included (so they still give the same bits).
struct gemv_tuning {
    float waves = 1.0f;     // split K so the launch has this many waves of resident warps' items
    int min_kb = 8;         // thinnest K slice, in 32-k blocks (4 = one 128-byte FP8 stage)
    int blocks_per_sm = 0;  // > 0: grid capped at this many blocks per SM, warps walk items
                            // grid-stride (fewer, longer-lived warps), each prefetching its next
                            // item's head into L2; 0: one warp per item
    bool l2_hint = false;   // weight copies carry .L2::256B (L2 fetches the next 128-byte stage too)
    // Bytes at the workspace start kept for the tile counters, the split-K partials and x after
    // them: a caller that keeps one workspace for many plans zeroes that region once, and a plan
    // whose counters fit in it (counters_bytes <= counters_reserve) needs no zeroing before it
    // runs (the kernels leave their counters at zero, and no other plan writes there).
    size_t counters_reserve = 0;
    // MXFP4 matrices' waves, times `waves`: their items are bound by each warp's latency, not by
    // bytes, so more, shorter items (more warps an SM) pay where one wave of them leaves SMs
    // half empty. V4.1 C1 (routed experts at B = 1: 12 + 6 matrices, ~13 warps an SM at one
    // wave), 16 layers, H200 2026-12-02, median step: 4.33 / 4.40 ms at 1, 4.11 / 4.10 at 2,
    // 4.16 / 4.18 at 3 (that build also had reference-numerics ONE instances, which alone moved
    // nothing: 4.35 / 4.43 at 1); C4 and C16 have tiles for a wave already and keep their slicing.
    float fp4_waves = 2.0f;
};

// The launch shape of one batch of matrices, computed on the host once per shape (a decode
// step captured in a graph reuses it): how each matrix is cut into work items and how much
// workspace its split-K partials need.
struct gemv_plan {
    gemv_tuning tuning;
    int max_blocks = 0;             // grid cap from tuning.blocks_per_sm (0: none)
    std::vector<gemv_matrix> mats;  // in launch order (grouped by format and numerics)
    std::vector<int> ksplit;       // K slices per 16-row tile, per matrix
    std::vector<size_t> x_offset;  // where each matrix's split x lives in the workspace
    size_t counters_bytes = 0;     // the tile counters' bytes, from the workspace start
    size_t workspace_bytes = 0;
};

const gemv_tuning &gemv_default_tuning();

// The K slicing depends on the tuning, the device and the whole batch (fixed per plan, so a
// replayed plan gives the same bits every time).
Result<gemv_plan> plan_gemv(const device_info &dev, const std::vector<gemv_matrix> &mats,
                            const gemv_tuning &tuning = gemv_default_tuning());

// workspace: workspace_bytes of device memory, zeroed once when allocated (the kernel leaves its
// tile counters at zero again after every run, so replays need no memset).
Status run_gemv(const gemv_plan &plan, void *workspace, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
