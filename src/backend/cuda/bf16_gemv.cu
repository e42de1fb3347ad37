// bf16_gemv (bf16_gemv.cuh): the decode GEMV over plain BF16 weights.
//
// Cost at V4.1's head (N 129280, K 5120, M 16): 1.32 GB of weights read once; 2 M N K = 21 GFLOP
// of products, done as 3 x that on the BF16 tensor cores (x in three pieces): 63 GFLOP, ~0.1 ms
// at the dense BF16 rate, so the weight stream bounds it: ~0.31 ms at the ~4.2 TB/s copy rate.
// x's pieces (M K 6 bytes, 0.5 MB at M 16) are re-read from L2 once per 32 weight rows.
// Measured (H200): 0.42 ms at M 1..8 (3.15 TB/s, 75% of copy), 0.54 ms at M 16.
//
// Work: a warp owns an item of 32 weight rows (two 16-row MMA tiles, which share each x fragment)
// over all of K, warps walking items grid-stride. Weights come straight from global memory into
// registers, 16 bytes per row and 32-k block a lane (no shared memory), in a ring D blocks deep
// so D - 1 blocks of every row are in flight while one is multiplied (x's pieces one block ahead,
// from L2); the first ones are asked for before the launch waits for its predecessor (pdl.cuh),
// since no kernel writes weights.
// Fragments use a permuted k, as the FP8 GEMV's do (gemv.cu): in each 32-k block lane q holds
// physical k 8q .. 8q+7 of its rows, fed to two m16n8k16 (k 8q .. 8q+3, then 8q+4 .. 8q+7);
// x's pieces are laid out to match (split_kernel), so every fragment is whole 16-byte loads.
// Order of an output's sum: 32-k blocks ascending; in each, the first half's hi, mid and lo MMAs,
// then the second half's: fixed by K alone.
//
// Invariants: 1 <= M <= 16, K % 32 == 0, x and w 16-byte aligned. Graph-replayable: yes.
// Test: tests/cuda/bf16_gemv_test.cpp: CPU reference (fp64 sums of the exact products) within
// 1e-5 of sum |x w| per output (measured 1.5e-6), NaN-poisoned y, M-invariance bit for bit.
#include "backend/cuda/bf16_gemv.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int WARPS = 4, TR = 2;  // warps per block; 16-row tiles per item

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
    return *reinterpret_cast<const uint32_t *>(&v);
}

// One thread per 4 consecutive k of a row: 24 bytes {hi(k, k+1), hi(k+2, k+3), mid(..), mid(..),
// lo(..), lo(..)}; hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid), each difference
// exact in fp32, so hi + mid + lo = x (x's 24 significant bits in three 8-bit pieces).
__global__ void split_kernel(const float4 *x, int groups, uint2 *xs) {
    pdl_enter();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= groups) return;
    const float4 v = x[i];
    float r[4] = {v.x, v.y, v.z, v.w}, p[3][4];
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
        for (int s = 0; s < 3; s++) {
            p[s][e] = __bfloat162float(__float2bfloat16_rn(r[e]));
            r[e] = r[e] - p[s][e];
        }
#pragma unroll
    for (int s = 0; s < 3; s++) xs[size_t(i) * 3 + s] = make_uint2(bf16x2_bits(p[s][0], p[s][1]), bf16x2_bits(p[s][2], p[s][3]));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldg_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// NT token tiles of 8 (M <= 8 NT); D: ring depth in 32-k blocks.
template <int NT, int D>
__global__ void __launch_bounds__(WARPS * 32) bf16_gemv_kernel(const uint16_t *w, const uint4 *xs, float *y, int M, int N,
                                                                int K) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int nkb = K / 32, items = (N + 16 * TR - 1) / (16 * TR);
    const int first = blockIdx.x * WARPS + (threadIdx.x >> 5), stride = gridDim.x * WARPS;
    const size_t row_u4 = size_t(K) / 8, x_row_u4 = size_t(K) * 6 / 16;
    const uint4 *xr[NT];
    bool xok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int m = nt * 8 + g;
        xok[nt] = m < M;
        xr[nt] = xs + size_t(xok[nt] ? m : 0) * x_row_u4 + 3 * q;
    }
    bool waited = false;
    for (int item = first; item < items; item += stride) {
        const uint4 *wr[TR][2];
        int rows[TR][2];
#pragma unroll
        for (int t = 0; t < TR; t++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                rows[t][j] = item * 16 * TR + t * 16 + j * 8 + g;
                wr[t][j] = reinterpret_cast<const uint4 *>(w) + size_t(min(rows[t][j], N - 1)) * row_u4 + q;
            }
        uint4 wv[D][TR][2];
        auto load_w = [&](uint4 (&dst)[TR][2], int kb) {
#pragma unroll
            for (int t = 0; t < TR; t++)
#pragma unroll
                for (int j = 0; j < 2; j++) dst[t][j] = ldg_stream(wr[t][j] + size_t(kb) * 4);
        };
#pragma unroll
        for (int i = 0; i < D - 1; i++)
            if (i < nkb) load_w(wv[i], i);
        if (!waited) {  // x is the split kernel's output
            pdl_wait();
            waited = true;
        }
        // x's pieces one block ahead (an L2 round trip each, which the MMAs of a block do not cover).
        uint4 xv[2][NT][3];
        auto load_x = [&](uint4 (&dst)[NT][3], int kb) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int s = 0; s < 3; s++) dst[nt][s] = xok[nt] ? __ldg(xr[nt] + size_t(kb) * 12 + s) : make_uint4(0, 0, 0, 0);
        };
        load_x(xv[0], 0);
        float acc[TR][NT][4] = {};
        for (int kb0 = 0; kb0 < nkb; kb0 += 2 * D) {  // 2 D: a whole turn of both rings
#pragma unroll
            for (int i = 0; i < 2 * D; i++) {
                const int kb = kb0 + i;
                if (kb >= nkb) break;
                if (kb + D - 1 < nkb) load_w(wv[(i + D - 1) % D], kb + D - 1);
                if (kb + 1 < nkb) load_x(xv[(i + 1) % 2], kb + 1);
#pragma unroll
                for (int t = 0; t < TR; t++) {
                    const uint4 a = wv[i % D][t][0], b = wv[i % D][t][1];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const uint4 u0 = xv[i % 2][nt][0], u1 = xv[i % 2][nt][1], u2 = xv[i % 2][nt][2];
                        // k 8q .. 8q+3: hi, mid, lo; then k 8q+4 .. 8q+7.
                        mma_bf16(acc[t][nt], a.x, b.x, a.y, b.y, u0.x, u0.y);
                        mma_bf16(acc[t][nt], a.x, b.x, a.y, b.y, u0.z, u0.w);
                        mma_bf16(acc[t][nt], a.x, b.x, a.y, b.y, u1.x, u1.y);
                        mma_bf16(acc[t][nt], a.z, b.z, a.w, b.w, u1.z, u1.w);
                        mma_bf16(acc[t][nt], a.z, b.z, a.w, b.w, u2.x, u2.y);
                        mma_bf16(acc[t][nt], a.z, b.z, a.w, b.w, u2.z, u2.w);
                    }
                }
            }
        }
        // acc[t][nt][i]: row rows[t][i / 2], token nt * 8 + 2q + (i & 1).
#pragma unroll
        for (int t = 0; t < TR; t++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int m = nt * 8 + 2 * q + (i & 1), r = rows[t][i >> 1];
                    if (m < M && r < N) y[size_t(m) * N + r] = acc[t][nt][i];
                }
    }
    if (!waited) pdl_wait();
    pdl_trigger();
}

template <int NT, int D>
int grid_for(int items) {
    static const int per_sm = [] {
        int dev = 0, sms = 1, blocks = 1;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, bf16_gemv_kernel<NT, D>, WARPS * 32, 0);
        return std::max(1, sms) * std::max(1, blocks);
    }();
    return std::max(1, std::min(per_sm, (items + WARPS - 1) / WARPS));
}

}  // namespace

size_t bf16_gemv_workspace_bytes(int M, int K) { return size_t(std::max(M, 0)) * size_t(std::max(K, 0)) * 6; }

Status bf16_gemv(const float *x, const uint16_t *w, float *y, int M, int N, int K, void *workspace, cudaStream_t stream) {
    if (M < 1 || M > BF16_GEMV_MAX_M || N < 1 || K < 32 || K % 32 != 0)
        return Status::invalid_argument("bf16_gemv: M " + std::to_string(M) + " (1..16), N " + std::to_string(N) + ", K " +
                                        std::to_string(K) + " (a multiple of 32)");
    if (!x || !w || !y || !workspace) return Status::invalid_argument("bf16_gemv: null pointer");
    if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(workspace)) & 15u)
        return Status::invalid_argument("bf16_gemv: x, w and the workspace must be 16-byte aligned");
    const int groups = M * K / 4;
    (void)launch_pdl(split_kernel, unsigned((groups + 255) / 256), 256, 0, stream, reinterpret_cast<const float4 *>(x), groups,
                     static_cast<uint2 *>(workspace));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const int items = (N + 16 * TR - 1) / (16 * TR);
    const uint4 *xs = static_cast<const uint4 *>(workspace);
    if (M <= 8)
        (void)launch_pdl(bf16_gemv_kernel<1, 3>, unsigned(grid_for<1, 3>(items)), WARPS * 32, 0, stream, w, xs, y, M, N, K);
    else
        (void)launch_pdl(bf16_gemv_kernel<2, 2>, unsigned(grid_for<2, 2>(items)), WARPS * 32, 0, stream, w, xs, y, M, N, K);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
