// The decode-width RMSNorm of one row held in registers by a block of VEC_THREADS threads (norm.cu
// rms_norm_vec_kernel says why this shape): shared by norm.cu and collapse_norm.cu, so a fused
// kernel normalizes with the same sum, in the same order, as the plain norm. Internal to
// backend/cuda: include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda::norm_detail {

constexpr int VEC_THREADS = 512, VEC_PER = 4;  // 512 threads x 4 float4 = 8192 channels

// 1 / sqrt(float(sum v^2 / dim) + eps) for the row whose float4 i = threadIdx.x + u * VEC_THREADS
// is v[u] (zeros past the row): every thread of the block gets it. Squares exact in fp64; per
// thread two fma chains a float4, then the warp butterfly, then warp 0 over the warps.
__device__ __forceinline__ float rms_inv(const float4 (&v)[VEC_PER], int dim4, float eps) {
    double ss = 0;
#pragma unroll
    for (int u = 0; u < VEC_PER; u++) {
        const double a = fma(double(v[u].x), double(v[u].x), double(v[u].y) * double(v[u].y));
        const double b = fma(double(v[u].z), double(v[u].z), double(v[u].w) * double(v[u].w));
        ss += a + b;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    __shared__ double part[VEC_THREADS / 32];
    __shared__ float inv_s;
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = threadIdx.x < VEC_THREADS / 32 ? part[threadIdx.x] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) inv_s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(t / double(dim4 * 4)), eps)));
    }
    __syncthreads();
    return inv_s;
}

// Four normalized outputs: w * (x * inv) (x * inv when unweighted), rounded to bf16 for OFFICIAL
// numerics.
__device__ __forceinline__ float4 rms_out4(float4 v, float4 w, bool weighted, float inv, bool rb) {
    auto one = [&](float xv, float wv) {
        float o = __fmul_rn(xv, inv);
        if (weighted) o = __fmul_rn(wv, o);
        return rb ? dev::round_bf16(o) : o;
    };
    return make_float4(one(v.x, w.x), one(v.y, w.y), one(v.z, w.z), one(v.w, w.w));
}

}  // namespace ds41rt::backend::cuda::norm_detail
