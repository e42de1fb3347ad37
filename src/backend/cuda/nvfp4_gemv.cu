// NVFP4 W4A4 decode GEMV on Hopper (no FP4 tensor cores: both operands are decoded in registers
// and multiplied as fp16 on mma.m16n8k16). Reference: backend/cpu nvfp4_w4a4_linear on the
// weights dequantized by model/nvfp4 (w = e2m1 * fp32(e4m3 * weight_scale_2)).
//
// Shapes: w [N, K/2] bytes (E2M1, low nibble = even k) and scale [N, K/16] E4M3, both as the
// checkpoint stores them; x [M, K] fp32; y [M, N] fp32; M <= 16, K % 32 == 0.
//
// Cost at V4.1 decode (no prefill shape: this is the decode kernel; prefill wants grouped GEMMs):
// one expert matrix (2304 x 5120 gate / up, or 5120 x 2304 down) is 5.90 MB of codes + 0.74 MB
// of scales = 6.64 MB (0.5625 B per weight) and 2 * M * 11.8 M FLOP: 3.6 * M FLOP per byte,
// under 60 at M = 16 against a ridge of ~200, so HBM binds. The six experts' w1 + w3 of one
// token (12 matrices, 79.6 MB) take ~18.5 us at the H200's ~4.3 TB/s copy rate; their w2 (39.8
// MB) ~9.3 us. The issue rate binds second: per 16-row x 128-k chunk (1,152 bytes) a warp spends
// ~170 instructions (mostly the code decode, ~3.5 per pair of weights; estimated from the PTX,
// not yet profiled), and 4.3 TB/s needs one chunk per ~280 issue slots of the whole GPU (132 SMs
// x 4 schedulers x ~1.98 GHz): ~60% of issue, so the decode is written for instruction count.
//
// Numerics (why the result is within fp32 summation error of the CPU's fp64 sum):
//  - x: nvfp4_quant_x_kernel reproduces backend/cpu nvfp4_fake_quant_act bit for bit (the same
//    IEEE fp32 divisions and products, E4M3 RNE saturating, E2M1 ties as ModelOpt's comparison
//    chain, bf16 RNE): xq is a bf16 value. It is stored as fp16 after a per-row power-of-two
//    shift that puts the row's largest |xq| in [2^14, 2^15): exact for every element down to
//    2^-31 of the row's largest (8 bf16 bits need fp16 values >= 2^-17); smaller ones round
//    with an absolute error of at most 2^-39 of that largest, far under fp32 summation error.
//  - w: an E2M1 code becomes its E4M3 byte (value * 2^-6, exact; 9 integer ops per 8 codes, as
//    gemv.cu), cvt.rn.f16x2.e4m3x2 makes it fp16 (exact), and one fp16 multiply by the E4M3
//    block scale (fp16, exact) gives code * scale * 2^-6: a multiple of 2^-16 with at most 6
//    significant bits and |.| <= 42, so exact in fp16 (subnormals kept: mul.rn.f16x2 without
//    .ftz). The block scale is folded into the operand, so an MMA may mix 16-blocks.
//  - products on the tensor cores are exact; a chunk's 8 MMAs chain in the accumulator (the
//    tensor core's own fp32 addition of 128 products), then one IEEE fp32 add per chunk into
//    the running sum; y = sum * (weight_scale_2 * rowmul * 2^-8), the shifts exact. The CPU
//    instead rounds each weight to fp32 once (w = fp32(code * fp32(scale * ws2))): a relative
//    2^-24 per weight, random in sign.
//
// Fragment layout: a warp owns 16 weight rows x one K slice and walks it in 128-k chunks. Lane
// (g = lane / 4, t = lane % 4) reads bytes [16t, 16t + 16) of the chunk's 64 bytes of rows g and
// g + 8 (one 16-byte load each; a warp load covers 8 whole 64-byte row segments), i.e. k
// [32t, 32t + 32): four 8-code words w, inside 16-block 2t + w / 2. A word's codes 0, 2, 4, 6 and
// 1, 3, 5, 7 become fp16 pairs (0,2), (4,6) for one MMA and (1,3), (5,7) for the next, so in
// logical k the MMA sees a permutation of the physical k; x is stored with the same permutation
// (each 8-k group of a row as [k0 k2 k4 k6 k1 k3 k5 k7] fp16, 16 bytes), so lane t's B fragments
// for a word are one 16-byte load. A dot product may sum its k in any order.
//
// Work and memory: items (16 rows x K slice) go one per warp; weights and scales stream with
// three chunks in flight per warp (registers, ld.global.nc with no L1 allocation and a 256-byte
// L2 prefetch, since the slice's next chunks of a row follow); x (small, shared by every tile)
// comes through L1. Split K when the launch has fewer tiles than resident warps, as gemv: each
// slice writes an fp32 partial, the last to arrive (atomic counter per tile) sums them in slice
// order and writes y, then resets the counter. Deterministic.
//
// Invariants: y does not alias x or w; matrices sharing x share M, K and input_scale (the plan
// checks). Graph-replayable: yes (weights, scalars and shapes are fixed per plan; x is read from
// device memory at run time). Test: tests/cuda/nvfp4_gemv_test.cpp, relative Frobenius error
// <= 1e-5 and every element within 1e-4 of the max |ref| against the CPU reference.
#include "backend/cuda/nvfp4_gemv.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/nvfp4_gemv_kernel.cuh"
#include "backend/cuda/splitk_plan.cuh"

namespace ds41rt::backend::cuda {

namespace {

using namespace nvfp4_detail;

__global__ void __launch_bounds__(QUANT_THREADS) nvfp4_quant_x_kernel(const __grid_constant__ quant_batch b) {
    const quant_job &J = b.jobs[blockIdx.y];
    if (int(blockIdx.x) >= J.M) return;
    quant_x_row(J, blockIdx.x);
}

template <int NT>  // token tiles of 8 (M <= 8 * NT)
__global__ void __launch_bounds__(WARPS * 32) nvfp4_gemv_kernel(const __grid_constant__ batch b) {
    const int item = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (item >= b.items) return;  // uniform across the warp
    int j = 0;
    while (j + 1 < b.njobs && item >= b.jobs[j + 1].item_begin) ++j;
    const job &J = b.jobs[j];
    nvfp4_item<NT>(J, item - J.item_begin);
}

// ---- host --------------------------------------------------------------------------------------

int tiles_of(const nvfp4_matrix &m) { return (m.N + 15) / 16; }
int chunks_of(const nvfp4_matrix &m) { return (m.K + CHUNK_K - 1) / CHUNK_K; }
using splitk::align256;
using splitk::token_tiles;

// Quantized x and its row multipliers (16 floats, the most rows).
size_t x_bytes(const nvfp4_matrix &m) { return align256(size_t(m.M) * m.K * 2) + align256(16 * sizeof(float)); }

bool same_x(const nvfp4_matrix &a, const nvfp4_matrix &b) {
    return a.x == b.x && a.M == b.M && a.K == b.K && a.input_scale == b.input_scale;
}

template <int NT>
int blocks_per_sm() {
    static const int blocks = splitk::resident_blocks(nvfp4_gemv_kernel<NT>, WARPS * 32);
    return blocks;
}

bool aligned(const void *p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

// Workspace layout: [tile counters][split-K partials][quantized x, one per distinct x].
Result<nvfp4_gemv_plan> plan_nvfp4_gemv(const device_info &dev, const std::vector<nvfp4_matrix> &mats) {
    nvfp4_gemv_plan plan;
    long total_tiles = 0;
    for (size_t i = 0; i < mats.size(); i++) {
        const nvfp4_matrix &m = mats[i];
        const std::string what = "nvfp4 gemv matrix " + std::to_string(i) + " (" + std::to_string(m.N) + " x " +
                                 std::to_string(m.K) + ", M " + std::to_string(m.M) + ")";
        if (m.M < 1 || m.N < 1 || m.K < 1) return Status::invalid_argument(what + ": empty shape");
        if (m.M > 16) return Status::not_supported(what + ": at most 16 activation rows per launch");
        if (m.K % 32 != 0) return Status::not_supported(what + ": K must be a multiple of 32");
        if (!m.w || !m.scale || !m.x || !m.y) return Status::invalid_argument(what + ": w, scale, x and y must be set");
        if (!aligned(m.w, 16) || !aligned(m.scale, 2) || !aligned(m.x, 16) || !aligned(m.y, 4))
            return Status::invalid_argument(what + ": w and x must be 16-byte aligned, scale 2-byte, y 4-byte");
        if (!(std::isfinite(m.weight_scale_2) && m.weight_scale_2 > 0) || !(std::isfinite(m.input_scale) && m.input_scale > 0))
            return Status::invalid_argument(what + ": weight_scale_2 " + std::to_string(m.weight_scale_2) + " and input_scale " +
                                            std::to_string(m.input_scale) + " must be positive and finite");
        for (size_t k = 0; k < i; k++)
            if (mats[k].x == m.x && !same_x(mats[k], m) && (mats[k].M != m.M || mats[k].K != m.K))
                return Status::invalid_argument(what + ": shares x with matrix " + std::to_string(k) + " at another M or K");
        total_tiles += tiles_of(m);
    }
    plan.mats = mats;
    // One wave of work items when K slicing can provide it (gemv.cu's reasoning): the resident
    // warp count comes from the device, never from a baked-in SM count.
    const int nt = token_tiles(mats);
    const int want = splitk::slices_wanted(
        long(dev.sm_count) * (nt == 1 ? blocks_per_sm<1>() : blocks_per_sm<2>()) * WARPS, total_tiles);
    const int slot_floats = nt * 4 * 32;
    splitk::workspace_layout ws;
    for (const nvfp4_matrix &m : plan.mats) {
        const int ks = splitk::slice_count(chunks_of(m), want, MIN_CHUNKS);
        plan.ksplit.push_back(ks);
        ws.add(size_t(tiles_of(m)), ks, size_t(slot_floats));
    }
    plan.workspace_bytes = splitk::place_x(plan.mats, ws.x_begin(), same_x, x_bytes, &plan.x_offset);
    return plan;
}

Status run_nvfp4_gemv(const nvfp4_gemv_plan &plan, void *workspace, cudaStream_t stream) {
    char *ws = static_cast<char *>(workspace);
    const int nt = token_tiles(plan.mats);
    const int slot_floats = nt * 4 * 32;
    splitk::workspace_layout layout;
    for (size_t i = 0; i < plan.mats.size(); i++) layout.add(size_t(tiles_of(plan.mats[i])), plan.ksplit[i], 0);
    unsigned *counters = reinterpret_cast<unsigned *>(ws);
    float *partials = reinterpret_cast<float *>(ws + layout.counters_bytes());
    auto xs_of = [&](size_t i) { return reinterpret_cast<uint4 *>(ws + plan.x_offset[i]); };
    auto rowmul_of = [&](size_t i) {
        const nvfp4_matrix &m = plan.mats[i];
        return reinterpret_cast<float *>(ws + plan.x_offset[i] + align256(size_t(m.M) * m.K * 2));
    };

    // Quantize every distinct x once.
    quant_batch qb{};
    int max_m = 1;
    auto flush = [&]() -> Status {
        if (qb.njobs == 0) return Status::ok();
        nvfp4_quant_x_kernel<<<dim3(unsigned(max_m), unsigned(qb.njobs)), QUANT_THREADS, 0, stream>>>(qb);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        qb.njobs = 0, max_m = 1;
        return Status::ok();
    };
    for (size_t i = 0; i < plan.mats.size(); i++) {
        if (!splitk::first_use(plan.x_offset, i)) continue;
        const nvfp4_matrix &m = plan.mats[i];
        quant_job &Q = qb.jobs[qb.njobs++];
        Q.x = m.x, Q.xs = xs_of(i), Q.rowmul = rowmul_of(i), Q.input_scale = m.input_scale, Q.M = m.M, Q.K = m.K;
        max_m = std::max(max_m, m.M);
        if (qb.njobs == MAX_JOBS) DS41RT_RETURN_IF_ERROR(flush());
    }
    DS41RT_RETURN_IF_ERROR(flush());

    size_t first = 0;
    while (first < plan.mats.size()) {
        batch b{};
        int items = 0;
        size_t i = first;
        for (; i < plan.mats.size() && b.njobs < MAX_JOBS; i++) {
            const nvfp4_matrix &m = plan.mats[i];
            const int ks = plan.ksplit[i];
            job &J = b.jobs[b.njobs++];
            J.w = m.w, J.scale = m.scale, J.y = m.y;
            J.xs = xs_of(i), J.rowmul = rowmul_of(i);
            J.alpha = m.weight_scale_2 * (1.0f / 256.0f);
            J.N = m.N, J.K = m.K, J.M = m.M;
            J.ksplit = ks;
            J.chunks_per_split = splitk::slice_len(chunks_of(m), ks);  // as plan_nvfp4_gemv
            J.item_begin = items;
            J.partials = partials, J.counters = counters;
            if (ks > 1) {
                counters += tiles_of(m);
                partials += size_t(tiles_of(m)) * ks * slot_floats;
            }
            items += tiles_of(m) * ks;
        }
        b.items = items;
        const int grid = (items + WARPS - 1) / WARPS;
        if (nt == 1)
            nvfp4_gemv_kernel<1><<<grid, WARPS * 32, 0, stream>>>(b);
        else
            nvfp4_gemv_kernel<2><<<grid, WARPS * 32, 0, stream>>>(b);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        first = i;
    }
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
