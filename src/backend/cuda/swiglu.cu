#include "backend/cuda/swiglu.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/numerics.cuh"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda {

namespace {

namespace gd = gemv_detail;

constexpr int THREADS = 256;

__device__ __forceinline__ float swiglu_one(const float *g, const float *u, const float *row_weight, int64_t t,
                                            int64_t inter, float lim, bool rb) {
    float gv = g[t], uv = u[t];
    if (lim > 0) {
        uv = fminf(fmaxf(uv, -lim), lim);
        gv = fminf(gv, lim);
    }
    const float e = float(exp(double(-gv)));
    float v = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, e)), uv);
    if (row_weight) v = __fmul_rn(row_weight[t / inter], v);
    return rb ? dev::round_bf16(v) : v;
}

// Bytes per call: rows * inter * 12 (g, u read, h written); one fp64 exp per element.
__global__ void swiglu_kernel(const float *g, const float *u, const float *row_weight, float *h, int64_t rows,
                              int64_t inter, float lim, bool rb) {
    pdl_enter();
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows * inter) return;
    h[t] = swiglu_one(g, u, row_weight, t, inter, lim, rb);
}

// With the split: a warp per (row, activation block) holds the block's h, agrees on its max by
// shuffles and writes the E4M3 codes and the block's scale as gemv_kernel.cuh split_x_rows does
// (act_scale / act_inv / act_code, the same layout). Bytes: rows * inter * (12 + 1) + the scales.
__global__ void swiglu_split_kernel(const float *g, const float *u, const float *row_weight, float *h, int rows,
                                    int inter, float lim, bool rb, uint8_t *xs, float *sx, int ab) {
    pdl_enter();
    constexpr int PER = 4;  // elements a lane holds: act_block <= 128
    const int warp = int((int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int blocks = inter / ab;
    if (warp >= rows * blocks) return;  // uniform across the warp
    const int r = warp / blocks, blk = warp - r * blocks;
    const int64_t base = int64_t(r) * inter + int64_t(blk) * ab;
    float v[PER];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int k = lane + 32 * j;
        v[j] = k < ab ? swiglu_one(g, u, row_weight, base + k, inter, lim, rb) : 0.0f;
        if (k < ab) h[base + k] = v[j], amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = gd::act_scale(amax), inv = gd::act_inv(s);
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (lane + 32 * j < ab) xs[base + lane + 32 * j] = gd::act_code(v[j], inv);
    if (lane < ab / 32) sx[(blk * (ab / 32) + lane) * gd::SX_TOKENS + r] = s;
}

}  // namespace

Status swiglu_rows(const float *g, const float *u, const float *row_weight, float *h, int64_t rows, int64_t inter,
                   float limit, bool round_bf16, cudaStream_t stream, const gemv_split *split, int act_block) {
    if (rows < 0 || inter <= 0 || !(limit >= 0))
        return Status::invalid_argument("swiglu_rows: rows " + std::to_string(rows) + ", inter " + std::to_string(inter) +
                                        ", limit " + std::to_string(limit) + " (>= 0)");
    if (rows == 0) return Status::ok();
    if (!g || !u || !h) return Status::invalid_argument("swiglu_rows: null g, u or h");
    if (split) {
        if (!split->xs || !split->sx) return Status::invalid_argument("swiglu_rows: a split needs xs and sx");
        if (rows > gemv_detail::SX_TOKENS || (act_block != 32 && act_block != 128) || inter % act_block != 0)
            return Status::invalid_argument("swiglu_rows: a split takes at most 16 rows and activation blocks of 32 or "
                                            "128 dividing inter (rows " + std::to_string(rows) + ", act_block " +
                                            std::to_string(act_block) + ", inter " + std::to_string(inter) + ")");
        const int64_t threads = rows * (inter / act_block) * 32;
        (void)launch_pdl(swiglu_split_kernel, unsigned((threads + THREADS - 1) / THREADS), THREADS, 0, stream, g, u,
                         row_weight, h, int(rows), int(inter), limit, round_bf16, split->xs, split->sx, act_block);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return Status::ok();
    }
    const int64_t n = rows * inter;
    (void)launch_pdl(swiglu_kernel, unsigned((n + THREADS - 1) / THREADS), THREADS, 0, stream, g, u, row_weight, h,
                     rows, inter, limit, round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
