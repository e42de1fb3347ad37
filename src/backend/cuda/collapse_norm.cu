// hc_collapse_norm: one block of VEC_THREADS per row (norm_row.cuh's decode-width shape). Each
// thread collapses its float4s of the row from the hc streams (collapse_kernel's fp32 steps;
// rms_norm_split, hc = 0: reads the row as it is),
// the block takes the row's RMS (rms_norm_vec_kernel's fp64 sum), each thread writes its
// normalized float4s and, with a split, their E4M3 codes: the act_block / 4 threads holding one
// activation block (8 or 32 consecutive lanes) agree on its max by shuffles and quantize through
// gemv_kernel.cuh's act_scale / act_code, as the GEMV's split_x_rows does.
//
// Bytes per row: D * 4 * (hc + 1) (streams in, y out) + D * 4 (w, cached) + D + D / 8 (split);
// FLOPs ~3 hc + 8 per channel. At V4.1 decode (D 5120, hc 4) ~100 KB a row: a few microseconds,
// the three launches it replaces each paid a launch and a ramp (H200 ncu, one row: collapse 2.6 us,
// norm 3.3, split 2.4; 2026-12-01).
//
// Test: tests/cuda/collapse_norm_test.cpp: bit-identical to hc_collapse -> rms_norm_rows -> the
// GEMV's split (y, codes and scales), and rms_norm_split to rms_norm_rows -> the GEMV's split,
// both numerics, act_block 32 and 128.
#include "backend/cuda/collapse_norm.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda {

namespace {

using namespace norm_detail;
namespace gd = gemv_detail;

constexpr int MAX_HC = 8;

// HC: the stream count when known at compile time (0: rms_norm_split's row as it is; 4: V4.1 and
// V4), so a thread's VEC_PER x HC stream loads are all issued before the first add (a run-time
// count left them one memory latency apart: 6.0 us a row under ncu, H200); -1: any hc <= 8.
template <int HC>
__global__ void __launch_bounds__(VEC_THREADS)
    collapse_norm_kernel(const float4 *X, const float *pre, int hc, int dim4, bool rb, const float4 *__restrict__ w,
                         float eps, float4 *y, uint32_t *xs, float *sx, int act_block) {
    pdl_enter();
    const int s = blockIdx.x;
    constexpr int NJ = HC < 0 ? MAX_HC : HC;
    float4 v[VEC_PER], g[VEC_PER];
    if constexpr (HC == 0) {
#pragma unroll
        for (int u = 0; u < VEC_PER; u++) {
            const int i = threadIdx.x + u * VEC_THREADS;
            v[u] = i < dim4 ? X[size_t(s) * dim4 + i] : make_float4(0, 0, 0, 0);
        }
    } else {
        float p[NJ];
        float4 x[VEC_PER][NJ];
#pragma unroll
        for (int j = 0; j < NJ; j++) p[j] = (HC > 0 || j < hc) ? pre[s * hc + j] : 0.0f;
#pragma unroll
        for (int u = 0; u < VEC_PER; u++)
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int i = threadIdx.x + u * VEC_THREADS;
                x[u][j] = i < dim4 && (HC > 0 || j < hc) ? X[(size_t(s) * hc + j) * dim4 + i] : make_float4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < VEC_PER; u++) {
            float4 a = make_float4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                if (HC < 0 && j >= hc) break;
                a.x = __fadd_rn(a.x, __fmul_rn(p[j], x[u][j].x)), a.y = __fadd_rn(a.y, __fmul_rn(p[j], x[u][j].y));
                a.z = __fadd_rn(a.z, __fmul_rn(p[j], x[u][j].z)), a.w = __fadd_rn(a.w, __fmul_rn(p[j], x[u][j].w));
            }
            if (rb) a = make_float4(dev::round_bf16(a.x), dev::round_bf16(a.y), dev::round_bf16(a.z), dev::round_bf16(a.w));
            v[u] = threadIdx.x + u * VEC_THREADS < dim4 ? a : make_float4(0, 0, 0, 0);
        }
    }
#pragma unroll
    for (int u = 0; u < VEC_PER; u++) {
        const int i = threadIdx.x + u * VEC_THREADS;
        g[u] = (w && i < dim4) ? w[i] : make_float4(1, 1, 1, 1);
    }
    const float inv = rms_inv(v, dim4, eps);
    const int lanes = act_block / 4;  // threads of one activation block: 8 or 32, aligned in the warp
#pragma unroll
    for (int u = 0; u < VEC_PER; u++) {
        const int i = threadIdx.x + u * VEC_THREADS;
        const float4 o = rms_out4(v[u], g[u], w != nullptr, inv, rb);
        if (i < dim4) y[size_t(s) * dim4 + i] = o;
        if (!xs) continue;
        float amax = i < dim4 ? fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w))) : 0.0f;
        for (int m = 1; m < lanes; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
        if (i >= dim4) continue;
        const float sc = gd::act_scale(amax), iv = gd::act_inv(sc);
        xs[size_t(s) * dim4 + i] = uint32_t(gd::act_code(o.x, iv)) | uint32_t(gd::act_code(o.y, iv)) << 8 |
                                   uint32_t(gd::act_code(o.z, iv)) << 16 | uint32_t(gd::act_code(o.w, iv)) << 24;
        if (i % 8 == 0) sx[(i / 8) * gd::SX_TOKENS + s] = sc;  // each 32-k block's scale (gemv_split)
    }
}

Status bad(const std::string &why) { return Status::invalid_argument("hc_collapse_norm / rms_norm_split: " + why); }

// The shapes and the split's, shared by both entry points (hc 0: rms_norm_split).
Status check(const float *X, int64_t S, int hc, int64_t D, const float *w, const float *y, const gemv_split *split,
             int act_block) {
    if (S < 0 || !collapse_norm_fits(hc == 0 ? 1 : hc, D))
        return bad("S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), D " + std::to_string(D) +
                   " (a multiple of 4, at most 8192)");
    if (S > 0 && (!X || !y)) return bad("null x or y");
    auto a16 = [](const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
    if (!a16(X) || !a16(y) || (w && !a16(w))) return bad("x, w and y must be 16-byte aligned");
    if (split) {
        if (!split->xs || !split->sx) return bad("a split needs xs and sx");
        if (S > gd::SX_TOKENS) return bad("a split holds at most 16 rows, not " + std::to_string(S));
        if ((act_block != 32 && act_block != 128) || D % act_block != 0)
            return bad("act_block " + std::to_string(act_block) + " (32 or 128, dividing D " + std::to_string(D) + ")");
        if ((reinterpret_cast<uintptr_t>(split->xs) & 3u) != 0) return bad("split xs must be 4-byte aligned");
    }
    return Status::ok();
}

Status launch(const float *X, const float *pre, int64_t S, int hc, int64_t D, bool round_bf16, const float *w, float eps,
              float *y, const gemv_split *split, int act_block, cudaStream_t stream) {
    const auto kernel = hc == 0 ? collapse_norm_kernel<0> : hc == 4 ? collapse_norm_kernel<4> : collapse_norm_kernel<-1>;
    (void)launch_pdl(kernel, unsigned(S), VEC_THREADS, 0, stream, reinterpret_cast<const float4 *>(X), pre, hc,
                     int(D / 4), round_bf16, reinterpret_cast<const float4 *>(w), eps, reinterpret_cast<float4 *>(y),
                     split ? reinterpret_cast<uint32_t *>(split->xs) : nullptr, split ? split->sx : nullptr, act_block);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace

bool collapse_norm_fits(int hc, int64_t D) {
    return hc >= 1 && hc <= MAX_HC && D > 0 && D % 4 == 0 && D <= int64_t(VEC_THREADS) * VEC_PER * 4;
}

Status hc_collapse_norm(const float *X, const float *pre, int64_t S, int hc, int64_t D, bool round_bf16, const float *w,
                        float eps, float *y, const gemv_split *split, int act_block, cudaStream_t stream) {
    if (hc < 1) return bad("hc " + std::to_string(hc) + " (1..8)");
    DS41RT_RETURN_IF_ERROR(check(X, S, hc, D, w, y, split, act_block));
    if (S == 0) return Status::ok();
    if (!pre) return bad("null pre");
    if (y < X + S * hc * D && X < y + S * D) return bad("y overlaps X");
    return launch(X, pre, S, hc, D, round_bf16, w, eps, y, split, act_block, stream);
}

Status rms_norm_split(const float *x, const float *w, float *y, int64_t S, int64_t D, bool round_bf16, float eps,
                      const gemv_split *split, int act_block, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(check(x, S, 0, D, w, y, split, act_block));
    if (S == 0) return Status::ok();
    if (y != x && y < x + S * D && x < y + S * D) return bad("y overlaps x other than in place");
    return launch(x, nullptr, S, 0, D, round_bf16, w, eps, y, split, act_block, stream);
}

}  // namespace ds41rt::backend::cuda
