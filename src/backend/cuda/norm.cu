#include "backend/cuda/norm.cuh"

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

using namespace norm_detail;

constexpr int NORM_THREADS = 256;

// Sum over the block in fp64; every thread gets the total.
__device__ double block_sum(double v) {
    __shared__ double part[NORM_THREADS / 32];
    __shared__ double total;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int i = 0; i < int(blockDim.x >> 5); i++) s += part[i];
        total = s;
    }
    __syncthreads();
    return total;
}

// One block per row. Bytes per call: rows * dim * 8 (x read, y written) + dim * 4 (w, cached);
// FLOPs ~3 per element. The squares are exact in fp64 (24 x 24 bits), so the fp64 sum differs from
// the host's only by fp64 rounding, which reaches the fp32 mean only at a rounding tie.
__global__ void rms_norm_kernel(const float *__restrict__ x, const float *__restrict__ w, float *y, int64_t dim,
                                float eps, bool rb) {
    pdl_enter();
    const float *xr = x + blockIdx.x * dim;
    float *yr = y + blockIdx.x * dim;
    // A thread's first PER elements are loaded together before any is used: with one load per
    // loop iteration the block waited a memory latency per element it owned (15 us for one
    // 5120-wide row on the H200). The sums keep their order (thread t: t, t + blockDim, ...).
    constexpr int PER = 24;  // NORM_THREADS * PER = 6144 >= V4.1's widest row
    float v[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        const int64_t i = threadIdx.x + int64_t(u) * blockDim.x;
        v[u] = i < dim ? xr[i] : 0.0f;
    }
    double ss = 0;
#pragma unroll
    for (int u = 0; u < PER; u++)
        if (threadIdx.x + int64_t(u) * blockDim.x < dim) ss += double(v[u]) * double(v[u]);
    for (int64_t i = threadIdx.x + int64_t(PER) * blockDim.x; i < dim; i += blockDim.x) ss += double(xr[i]) * double(xr[i]);
    ss = block_sum(ss);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(ss / double(dim)), eps)));
    auto out = [&](int64_t i, float xv) {
        float o = __fmul_rn(xv, inv);
        if (w) o = __fmul_rn(w[i], o);
        yr[i] = rb ? dev::round_bf16(o) : o;
    };
#pragma unroll
    for (int u = 0; u < PER; u++) {
        const int64_t i = threadIdx.x + int64_t(u) * blockDim.x;
        if (i < dim) out(i, v[u]);
    }
    for (int64_t i = threadIdx.x + int64_t(PER) * blockDim.x; i < dim; i += blockDim.x) out(i, xr[i]);
}

// The decode-width kernel (dim % 4 == 0, 16-byte aligned rows, dim <= 8192): one block of
// VEC_THREADS per row, each thread's float4s of x and of w issued together before any is used,
// so a row costs one memory round trip, then one fp64 block sum (warp shuffles, then warp 0).
// The scalar kernel above took 10-17 us for one 5120-wide decode row on the H200 (ncu, session
// 7: one 256-thread block, 112 registers, 23 cycles between a warp's instructions: its fp64 sum
// is a 20-deep dependent chain per thread and its w loads wait for the sum). Bytes per row:
// dim * 8 + dim * 4 (w); FLOPs ~4 per element. Same fp32 steps as the scalar kernel; the fp64
// sum's order differs, which the tolerance above covers.
__global__ void __launch_bounds__(VEC_THREADS) rms_norm_vec_kernel(const float4 *x, const float4 *__restrict__ w,
                                                                  float4 *y, int dim4, float eps, bool rb) {
    pdl_enter();
    const float4 *xr = x + size_t(blockIdx.x) * dim4;
    float4 *yr = y + size_t(blockIdx.x) * dim4;
    float4 v[VEC_PER], g[VEC_PER];
#pragma unroll
    for (int u = 0; u < VEC_PER; u++) {
        const int i = threadIdx.x + u * VEC_THREADS;
        v[u] = i < dim4 ? xr[i] : make_float4(0, 0, 0, 0);
        g[u] = (w && i < dim4) ? w[i] : make_float4(1, 1, 1, 1);
    }
    const float inv = rms_inv(v, dim4, eps);
#pragma unroll
    for (int u = 0; u < VEC_PER; u++) {
        const int i = threadIdx.x + u * VEC_THREADS;
        if (i < dim4) yr[i] = rms_out4(v[u], g[u], w != nullptr, inv, rb);
    }
}

// One block per row; thread 0 adds the bf16 squares in channel order (dim dependent adds: ~2 us
// for 512 channels, fine for the q heads of a decode step). Bytes: rows * dim * 8.
__global__ void rms_norm_bf16_kernel(float *x, int64_t dim, float eps) {
    extern __shared__ float sq[];
    __shared__ float inv_s;
    float *p = x + blockIdx.x * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sq[i] = dev::round_bf16(__fmul_rn(p[i], p[i]));
    __syncthreads();
    if (threadIdx.x == 0) {
        float ss = 0;
        for (int64_t i = 0; i < dim; i++) ss = __fadd_rn(ss, sq[i]);
        const float mean = dev::round_bf16(__fdiv_rn(ss, float(dim)));
        inv_s = dev::round_bf16(__fdiv_rn(1.0f, __fsqrt_rn(dev::round_bf16(__fadd_rn(mean, eps)))));
    }
    __syncthreads();
    const float inv = inv_s;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) p[i] = dev::round_bf16(__fmul_rn(p[i], inv));
}

}  // namespace

Status rms_norm_rows(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps, bool round_bf16,
                     cudaStream_t stream) {
    if (rows < 0 || dim <= 0) return Status::invalid_argument("rms_norm_rows: rows " + std::to_string(rows) + ", dim " + std::to_string(dim));
    if (rows == 0) return Status::ok();
    if (!x || !y) return Status::invalid_argument("rms_norm_rows: null x or y");
    if (rows > 0x7fffffff) return Status::invalid_argument("rms_norm_rows: more than 2^31 rows");
    auto a16 = [](const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
    // In place (y == x) is fine for both kernels: each element is read before it is written, by
    // the thread that writes it.
    if (dim % 4 == 0 && dim <= int64_t(VEC_THREADS) * VEC_PER * 4 && a16(x) && a16(y) && (!w || a16(w)))
        (void)launch_pdl(rms_norm_vec_kernel, unsigned(rows), VEC_THREADS, 0, stream,
                         reinterpret_cast<const float4 *>(x), reinterpret_cast<const float4 *>(w),
                         reinterpret_cast<float4 *>(y), int(dim / 4), eps, round_bf16);
    else
        (void)launch_pdl(rms_norm_kernel, unsigned(rows), NORM_THREADS, 0, stream, x, w, y, dim, eps, round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status rms_norm_unweighted_bf16_rows(float *x, int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
    if (rows < 0 || dim <= 0 || dim > 8192)
        return Status::invalid_argument("rms_norm_unweighted_bf16_rows: rows " + std::to_string(rows) + ", dim " +
                                        std::to_string(dim) + " (1..8192)");
    if (rows == 0) return Status::ok();
    if (!x) return Status::invalid_argument("rms_norm_unweighted_bf16_rows: null x");
    if (rows > 0x7fffffff) return Status::invalid_argument("rms_norm_unweighted_bf16_rows: more than 2^31 rows");
    rms_norm_bf16_kernel<<<unsigned(rows), 128, size_t(dim) * sizeof(float), stream>>>(x, dim, eps);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
