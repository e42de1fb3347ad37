// Decode GEMV over FP8-block and MXFP4 weights (the dense projections and routed experts of
// V4 / V4.1 at small batch). Reference: backend/cpu matmul_nt on the dequantized weight.
//
// Shapes: W [N, K] stored as in the checkpoint (FP8: one byte per weight; MXFP4: two per byte);
// x [M, K] fp32; y [M, N] fp32; M is the decode batch (1..16).
//
// Cost at V4.1 decode, M = 1: wq_b (FP8 32768 x 1280) reads 41.9 MB of weight + 41 KB of scales
// and does 2 * 32768 * 1280 = 84 MFLOP: 2 FLOP per weight byte, far under the ~200 FLOP/byte
// ridge, so the bound is HBM bandwidth (about 4.3 TB/s measured copy rate on the H200: ~10 us).
// A routed expert's w1 (MXFP4 2304 x 5120) reads 5.9 MB + 0.37 MB scales: ~1.5 us.
//
// Design: a block of 8 warps covers a tile of rows; WPR warps (1, 2, 4 or 8, chosen from K so
// that each warp makes about 10-16 passes) share a group of ROWS rows and split its K. Each
// 4-byte load of a weight row is coalesced across the warp (FP8: 4 weights, MXFP4: 8) and the
// matching x floats are contiguous across the warp too (one float4, or two): every L1
// wavefront is a full line for both. ROWS rows share each x load, so every thread has ROWS
// independent weight loads in flight. x comes through L1 (__ldg): each SM pulls it from L2 once.
// A thread's 4 or 8 weights share one scale. Sums are reduced within the warp by shuffles, then
// across the WPR warps in shared memory, in a fixed order (deterministic; not the CPU's order,
// so results differ from the reference by fp32 summation rounding only).
//
// History (docs/perf/2026-11-30-gemv.md): v1 gave each warp whole rows with 16-byte lanes and
// staged x per block in shared memory; v2 split K across the whole block with 16-byte lanes and
// a 64-byte x stride (16 L1 wavefronts per x load); v3 used 4-byte lanes across the whole block
// (a block-wide reduction per 4 rows dominated at small K); v4 is this.
//
// Invariants: y must not alias x or W. Graph-replayable: yes (no host reads, fixed grid).
// Test: tests/unit/cuda_gemv_test.cpp, relative error vs the CPU reference <= 1e-5.
#include "backend/cuda/gemv.cuh"

#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int ROWS = 4;   // output rows per row group (they share each x load)
constexpr int MAX_M = 4;  // activation rows per launch; more are processed in groups

__device__ __forceinline__ float e8m0_to_float(uint8_t e) {
    return e == 0 ? __int_as_float(0x00400000) : __int_as_float(int(e) << 23);  // 2^(e-127)
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Weights are read once per token: stream them past L1.
__device__ __forceinline__ uint4 load_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float4 fp8x4_to_float4(uint32_t w) {
    __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xffff), __NV_E4M3);
    __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
    float2 a = __half22float2(*reinterpret_cast<__half2 *>(&lo)), b = __half22float2(*reinterpret_cast<__half2 *>(&hi));
    return make_float4(a.x, a.y, b.x, b.y);
}

// Two E2M1 codes (the low byte of b: low nibble first) as floats divided by 2^14. Placing a
// code's sign at fp16 bit 15 and its 3 magnitude bits at bits 11..9 gives exactly 2^-14 times
// its value (e = 0 lands on fp16 subnormals, m * 0.5 * 2^-14); the caller folds 2^14 into the
// block scale. Integer ops instead of a table: no shared-memory traffic per weight.
__device__ __forceinline__ float2 e2m1_scaled_x2(uint32_t b) {
    const uint32_t h = ((b & 0x8u) << 12) | ((b & 0x7u) << 9) | ((b & 0x80u) << 24) | ((b & 0x70u) << 21);
    return __half22float2(*reinterpret_cast<const __half2 *>(&h));
}

// FP4 = false: FP8 E4M3 with a [block_out, block_in] e8m0 grid, 4 weights per 4-byte load.
// FP4 = true: MXFP4 with one e8m0 per (row, 32 k), 8 weights per 4-byte load.
template <int M, int WPR, bool FP4>
__global__ void __launch_bounds__(THREADS) gemv_kernel(gemv_params p) {
    constexpr int VEC = FP4 ? 32 : 16;   // weights per 16-byte load
    constexpr int XV = VEC / 4;          // float4 loads of x per weight load
    constexpr int GROUPS = WARPS / WPR;  // row groups per block
    constexpr int TILE = GROUPS * ROWS;  // rows per block pass
    __shared__ float red[WARPS][ROWS * M];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / WPR, slice = warp % WPR;
    const size_t row_bytes = FP4 ? size_t(p.K) / 2 : size_t(p.K);
    const int scale_cols = FP4 ? p.K / 32 : (p.K + p.block_in - 1) / p.block_in;
    for (int tile = blockIdx.x; tile * TILE < p.N; tile += gridDim.x) {  // uniform across the block
        const int n0 = tile * TILE + group * ROWS;
        float acc[ROWS][M] = {};
        for (int k = (slice * 32 + lane) * VEC; k < p.K; k += WPR * 32 * VEC) {
            uint4 wv[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (n0 + r < p.N)
                    wv[r] = load_stream(reinterpret_cast<const uint4 *>(p.w + size_t(n0 + r) * row_bytes + (FP4 ? k / 2 : k)));
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (n0 + r >= p.N) break;
                // Decode the row's 16 (FP8) or 32 (MXFP4) weights once; x comes from L1 per m.
                float wf[VEC];
                float s;
                const uint32_t words[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
                if constexpr (FP4) {
                    // The 2^14 that e2m1_scaled_x2 leaves out is folded into the scale.
                    s = e8m0_to_float(__ldg(p.scale + size_t(n0 + r) * scale_cols + k / 32)) * 16384.0f;
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int b = 0; b < 4; b++) {
                            const float2 f = e2m1_scaled_x2(words[j] >> (8 * b));
                            wf[8 * j + 2 * b] = f.x;
                            wf[8 * j + 2 * b + 1] = f.y;
                        }
                } else {
                    s = e8m0_to_float(__ldg(p.scale + size_t((n0 + r) / p.block_out) * scale_cols + k / p.block_in));
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const float4 f = fp8x4_to_float4(words[j]);
                        wf[4 * j] = f.x, wf[4 * j + 1] = f.y, wf[4 * j + 2] = f.z, wf[4 * j + 3] = f.w;
                    }
                }
#pragma unroll
                for (int m = 0; m < M; m++) {
                    const float4 *x4 = reinterpret_cast<const float4 *>(p.x + size_t(m) * p.K + k);
                    float part = 0;
#pragma unroll
                    for (int j = 0; j < XV; j++) {
                        const float4 xv = __ldg(x4 + j);
                        part += wf[4 * j] * xv.x + wf[4 * j + 1] * xv.y + wf[4 * j + 2] * xv.z + wf[4 * j + 3] * xv.w;
                    }
                    acc[r][m] += part * s;
                }
            }
        }
        // Reduce: lanes by butterfly, then the group's WPR warps in order.
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float v = warp_sum(acc[r][m]);
                if (WPR == 1) {
                    if (lane == 0 && n0 + r < p.N) p.y[size_t(m) * p.N + n0 + r] = v;
                } else if (lane == 0) {
                    red[warp][r * M + m] = v;
                }
            }
        if (WPR > 1) {
            __syncthreads();
            if (slice == 0 && lane < ROWS * M) {
                const int r = lane / M, m = lane % M;
                float v = 0;
                for (int w = 0; w < WPR; w++) v += red[group * WPR + w][lane];
                if (n0 + r < p.N) p.y[size_t(m) * p.N + n0 + r] = v;
            }
            __syncthreads();  // red is reused by the next tile
        }
    }
}

// Warps per row group: enough that each warp makes about one pass over K (16-byte lanes), so
// the whole matrix is requested in as few rounds of memory latency as the grid allows.
int warps_per_row(int K, int vec) {
    int w = 1;
    while (w < WARPS && K > w * 32 * vec) w *= 2;
    return w;
}

template <int M, int WPR, bool FP4>
Status launch(const gemv_params &q, const device_info &dev, cudaStream_t s) {
    constexpr int TILE = (WARPS / WPR) * ROWS;
    // Up to 8 resident blocks of 256 threads per SM; the tile loop covers larger N.
    const int grid = std::max(1, std::min(dev.sm_count * 8, (q.N + TILE - 1) / TILE));
    gemv_kernel<M, WPR, FP4><<<grid, THREADS, 0, s>>>(q);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

// The supported (M group, warps per row) instances, in one place.
template <bool FP4>
Status dispatch(const gemv_params &q, const device_info &dev, cudaStream_t s) {
    const int wpr = warps_per_row(q.K, FP4 ? 32 : 16);
#define DS41RT_GEMV_WPR(M)                                      \
    switch (wpr) {                                              \
    case 1: return launch<M, 1, FP4>(q, dev, s);                \
    case 2: return launch<M, 2, FP4>(q, dev, s);                \
    case 4: return launch<M, 4, FP4>(q, dev, s);                \
    default: return launch<M, 8, FP4>(q, dev, s);               \
    }
    switch (q.M) {
    case 1: DS41RT_GEMV_WPR(1)
    case 2: DS41RT_GEMV_WPR(2)
    case 3: DS41RT_GEMV_WPR(3)
    case 4: DS41RT_GEMV_WPR(4)
    }
#undef DS41RT_GEMV_WPR
    return Status::not_supported("gemv: M group " + std::to_string(q.M));
}

// Runs the kernel over groups of at most MAX_M activation rows.
template <bool FP4>
Status run_groups(const device_info &dev, const gemv_params &p, cudaStream_t s) {
    if (p.M < 1 || p.N < 1 || p.K < 1) return Status::invalid_argument("gemv: empty shape");
    for (int m0 = 0; m0 < p.M; m0 += MAX_M) {
        gemv_params q = p;
        q.M = std::min(MAX_M, p.M - m0);
        q.x = p.x + size_t(m0) * p.K;
        q.y = p.y + size_t(m0) * p.N;
        DS41RT_RETURN_IF_ERROR(dispatch<FP4>(q, dev, s));
    }
    return Status::ok();
}

}  // namespace

Status gemv_fp8_block(const device_info &dev, const gemv_params &p, cudaStream_t stream) {
    if (p.K % 16 != 0 || p.block_in % 16 != 0)
        return Status::not_supported("gemv_fp8_block: K and block_in must be multiples of 16");
    return run_groups<false>(dev, p, stream);
}

Status gemv_mxfp4(const device_info &dev, const gemv_params &p, cudaStream_t stream) {
    if (p.K % 32 != 0) return Status::not_supported("gemv_mxfp4: K must be a multiple of 32");
    return run_groups<true>(dev, p, stream);
}

}  // namespace ds41rt::backend::cuda
