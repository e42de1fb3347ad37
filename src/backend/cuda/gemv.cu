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
// Design: one block of 256 threads owns ROWS consecutive output rows at a time (grid-stride
// over row groups, grid sized from the SM count); all its threads split K into 16-byte chunks
// (coalesced across the warp, 16-byte loads, ROWS independent loads in flight per thread), so
// even the small projections (wkv: 512 rows) spread over every SM. x is read through L1
// (__ldg); each SM pulls it from L2 once, not once per block. FP8: a 16-byte chunk is 16 weights
// inside one scale block; MXFP4: 32 weights sharing exactly one scale. Partial sums are reduced
// within the warp by shuffles, then across warps in shared memory, in a fixed order
// (deterministic; not the CPU's order, so results differ from the reference by fp32 summation
// rounding only).
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
constexpr int ROWS = 4;   // output rows per block pass
constexpr int MAX_M = 4;  // activation rows per launch; more are processed in groups

__device__ __forceinline__ float e8m0_to_float(uint8_t e) {
    return e == 0 ? __int_as_float(0x00400000) : __int_as_float(int(e) << 23);  // 2^(e-127)
}

__device__ __forceinline__ void fp8x16_to_float(const uint4 v, float *out) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[i] >> (16 * h)), __NV_E4M3);
            float2 f = __half22float2(*reinterpret_cast<__half2 *>(&r));
            out[4 * i + 2 * h] = f.x;
            out[4 * i + 2 * h + 1] = f.y;
        }
    }
}

// Weights are read exactly once per token: stream them past L1.
__device__ __forceinline__ uint4 load_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sums acc[ROWS][M] over the block and writes y[m, n0 + r]. Fixed order: lanes by butterfly,
// then warps 0..7 in order.
template <int M>
__device__ __forceinline__ void block_reduce_store(float (&acc)[ROWS][M], float *red, const gemv_params &p, int n0) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int m = 0; m < M; m++) {
            float v = warp_sum(acc[r][m]);
            if (lane == 0) red[warp * ROWS * M + r * M + m] = v;
        }
    __syncthreads();
    if (threadIdx.x < ROWS * M) {
        const int r = threadIdx.x / M, m = threadIdx.x % M;
        float v = 0;
        for (int w = 0; w < WARPS; w++) v += red[w * ROWS * M + threadIdx.x];
        if (n0 + r < p.N) p.y[size_t(m) * p.N + n0 + r] = v;
    }
    __syncthreads();  // red is reused by the next row group
}

template <int M>
__global__ void __launch_bounds__(THREADS) gemv_fp8_block_kernel(gemv_params p) {
    __shared__ float red[WARPS * ROWS * M];
    const int chunks = p.K / 16;
    const int scale_cols = (p.K + p.block_in - 1) / p.block_in;
    const float4 *x4 = reinterpret_cast<const float4 *>(p.x);
    for (int n0 = blockIdx.x * ROWS; n0 < p.N; n0 += gridDim.x * ROWS) {
        float acc[ROWS][M] = {};
        for (int c = threadIdx.x; c < chunks; c += THREADS) {
            uint4 wv[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (n0 + r < p.N) wv[r] = load_stream(reinterpret_cast<const uint4 *>(p.w + size_t(n0 + r) * p.K) + c);
            float xv[M][16];
#pragma unroll
            for (int m = 0; m < M; m++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float4 t = __ldg(x4 + size_t(m) * (p.K / 4) + c * 4 + j);
                    xv[m][4 * j] = t.x, xv[m][4 * j + 1] = t.y, xv[m][4 * j + 2] = t.z, xv[m][4 * j + 3] = t.w;
                }
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (n0 + r >= p.N) break;
                float wf[16];
                fp8x16_to_float(wv[r], wf);
                const float s = e8m0_to_float(__ldg(p.scale + size_t((n0 + r) / p.block_out) * scale_cols + (c * 16) / p.block_in));
#pragma unroll
                for (int m = 0; m < M; m++) {
                    float part = 0;
#pragma unroll
                    for (int i = 0; i < 16; i++) part += wf[i] * xv[m][i];
                    acc[r][m] += part * s;
                }
            }
        }
        block_reduce_store<M>(acc, red, p, n0);
    }
}

__constant__ float E2M1_LUT[16] = {0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

template <int M>
__global__ void __launch_bounds__(THREADS) gemv_mxfp4_kernel(gemv_params p) {
    __shared__ float red[WARPS * ROWS * M];
    __shared__ float lut[16];  // 16 words in 16 banks: divergent lookups never conflict
    if (threadIdx.x < 16) lut[threadIdx.x] = E2M1_LUT[threadIdx.x];
    __syncthreads();
    const int chunks = p.K / 32;
    const float4 *x4 = reinterpret_cast<const float4 *>(p.x);
    for (int n0 = blockIdx.x * ROWS; n0 < p.N; n0 += gridDim.x * ROWS) {
        float acc[ROWS][M] = {};
        for (int c = threadIdx.x; c < chunks; c += THREADS) {
            uint4 wv[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (n0 + r < p.N)
                    wv[r] = load_stream(reinterpret_cast<const uint4 *>(p.w + size_t(n0 + r) * (p.K / 2)) + c);
            float xv[M][32];
#pragma unroll
            for (int m = 0; m < M; m++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float4 t = __ldg(x4 + size_t(m) * (p.K / 4) + c * 8 + j);
                    xv[m][4 * j] = t.x, xv[m][4 * j + 1] = t.y, xv[m][4 * j + 2] = t.z, xv[m][4 * j + 3] = t.w;
                }
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (n0 + r >= p.N) break;
                const float s = e8m0_to_float(__ldg(p.scale + size_t(n0 + r) * chunks + c));
                const uint32_t words[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
                float wf[32];
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int i = 0; i < 8; i++) wf[8 * j + i] = lut[(words[j] >> (4 * i)) & 15];
#pragma unroll
                for (int m = 0; m < M; m++) {
                    float part = 0;
#pragma unroll
                    for (int i = 0; i < 32; i++) part += wf[i] * xv[m][i];
                    acc[r][m] += part * s;
                }
            }
        }
        block_reduce_store<M>(acc, red, p, n0);
    }
}

// Runs launch(q, grid) over groups of at most MAX_M activation rows.

template <typename Launch>
Status for_row_groups(const device_info &dev, const gemv_params &p, Launch &&launch) {
    if (p.M < 1 || p.N < 1 || p.K < 1) return Status::invalid_argument("gemv: empty shape");
    for (int m0 = 0; m0 < p.M; m0 += MAX_M) {
        gemv_params q = p;
        q.M = std::min(MAX_M, p.M - m0);
        q.x = p.x + size_t(m0) * p.K;
        q.y = p.y + size_t(m0) * p.N;
        // Up to 8 resident blocks of 256 threads per SM keep enough loads in flight; the
        // grid-stride row loop covers larger N.
        const int grid = std::max(1, std::min(dev.sm_count * 8, (q.N + ROWS - 1) / ROWS));
        DS41RT_RETURN_IF_ERROR(launch(q, grid));
    }
    return Status::ok();
}

template <int M>
Status launch_fp8(const gemv_params &q, int grid, cudaStream_t s) {
    gemv_fp8_block_kernel<M><<<grid, THREADS, 0, s>>>(q);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

template <int M>
Status launch_mxfp4(const gemv_params &q, int grid, cudaStream_t s) {
    gemv_mxfp4_kernel<M><<<grid, THREADS, 0, s>>>(q);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace

Status gemv_fp8_block(const device_info &dev, const gemv_params &p, cudaStream_t stream) {
    if (p.K % 16 != 0 || p.block_in % 16 != 0)
        return Status::not_supported("gemv_fp8_block: K and block_in must be multiples of 16");
    return for_row_groups(dev, p, [&](const gemv_params &q, int grid) -> Status {
        switch (q.M) {  // the supported batch widths, in one place
        case 1: return launch_fp8<1>(q, grid, stream);
        case 2: return launch_fp8<2>(q, grid, stream);
        case 3: return launch_fp8<3>(q, grid, stream);
        case 4: return launch_fp8<4>(q, grid, stream);
        default: return Status::not_supported("gemv_fp8_block: M group " + std::to_string(q.M));
        }
    });
}

Status gemv_mxfp4(const device_info &dev, const gemv_params &p, cudaStream_t stream) {
    if (p.K % 32 != 0) return Status::not_supported("gemv_mxfp4: K must be a multiple of 32");
    return for_row_groups(dev, p, [&](const gemv_params &q, int grid) -> Status {
        switch (q.M) {
        case 1: return launch_mxfp4<1>(q, grid, stream);
        case 2: return launch_mxfp4<2>(q, grid, stream);
        case 3: return launch_mxfp4<3>(q, grid, stream);
        case 4: return launch_mxfp4<4>(q, grid, stream);
        default: return Status::not_supported("gemv_mxfp4: M group " + std::to_string(q.M));
        }
    });
}

}  // namespace ds41rt::backend::cuda
