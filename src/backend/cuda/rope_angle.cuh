// One RoPE pair's rotation as backend/cpu rope_tail computes it, shared by rope.cu and the fused
// KV-row kernel (kv_row.cu). Internal to backend/cuda: include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41rt::backend::cuda::dev {

// The host forms float(pos) * inv_freq in fp32, then cosf / sinf (engine/rope.cpp eval).
__device__ __forceinline__ void rope_angle(int64_t pos, float inv_freq, float *c, float *s) {
    const float a = __fmul_rn(__ll2float_rn(pos), inv_freq);
    double sd, cd;
    sincos(double(a), &sd, &cd);
    *c = float(cd);
    *s = float(sd);
}

// (a, b) rotated by (c, s): products and sums rounded separately (no FMA), as the host does.
__device__ __forceinline__ float2 rope_rotate(float a, float b, float c, float s) {
    return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

}  // namespace ds41rt::backend::cuda::dev
