// The block quantizers of the caches and activations, as device code shared by fake_quant.cu
// (quantize and dequantize in place) and cache_pack.cu (quantize to packed codes + scales).
// Each thread owns 4 consecutive channels; the B / 4 lanes of one block (B = 16 .. 128) meet
// by shuffles inside a warp. Every step is the host's fp32 operation (backend/cpu ops.cpp).
#pragma once

#include <cstdint>

#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda::dev {

enum class qkind { FP8_UE8M0, FP4_UE8M0, FP4_E4M3 };

// The lanes of a block (lanes = B / 4, a power of two <= 32, blocks aligned in the warp) agree
// on their amax. Every lane of the warp must call this (full-mask shuffles).
__device__ __forceinline__ float block_amax(float4 v, int lanes) {
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int o = 1; o < lanes; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

struct block_scale {
    float s;           // the dequantization scale
    uint8_t code;      // its stored form: E8M0 code, or E4M3 code for FP4_E4M3
};

template <qkind K>
__device__ __forceinline__ block_scale scale_of(float amax) {
    block_scale r;
    if constexpr (K == qkind::FP8_UE8M0) {
        r.s = pow2_ceil(__fmul_rn(fmaxf(amax, 1e-4f), 1.0f / 448.0f));
        r.code = e8m0_code(r.s);
    } else if constexpr (K == qkind::FP4_UE8M0) {
        r.s = pow2_ceil(__fmul_rn(fmaxf(amax, 6.0f * 0x1p-126f), 1.0f / 6.0f));
        r.code = e8m0_code(r.s);
    } else {
        r.code = e4m3_code(__fdiv_rn(fmaxf(amax, 6.0f * 0x1p-9f), 6.0f));
        r.s = e4m3_value(r.code);
    }
    return r;
}

// The element's code on the grid (E4M3 byte or E2M1 nibble) given the block scale.
template <qkind K>
__device__ __forceinline__ uint8_t code_of(float v, float s) {
    const float q = __fdiv_rn(v, s);
    if constexpr (K == qkind::FP8_UE8M0) return e4m3_code(fminf(fmaxf(q, -448.0f), 448.0f));
    else return e2m1_code(fminf(fmaxf(q, -6.0f), 6.0f));
}

template <qkind K>
__device__ __forceinline__ float value_of(uint8_t code, float s) {
    if constexpr (K == qkind::FP8_UE8M0) return __fmul_rn(e4m3_value(code), s);
    else return __fmul_rn(e2m1_value(code), s);
}

__device__ __forceinline__ float scale_value(qkind k, uint8_t code) {
    return k == qkind::FP4_E4M3 ? e4m3_value(code) : e8m0_value(code);
}

}  // namespace ds41rt::backend::cuda::dev
