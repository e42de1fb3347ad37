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

// A packed row's channels 4 c4 .. 4 c4 + 3 (FP8: a byte each; FP4: a nibble each, low first) and,
// from the first lane of their block (lanes = block / 4), the block's scale byte. amax: the
// block's (block_amax).
template <qkind K>
__device__ __forceinline__ void pack_quad(float4 v, float amax, int64_t c4, int lanes, uint8_t *codes, uint8_t *scales) {
    const block_scale s = scale_of<K>(amax);
    const uint32_t c0 = code_of<K>(v.x, s.s), c1 = code_of<K>(v.y, s.s), c2 = code_of<K>(v.z, s.s), c3 = code_of<K>(v.w, s.s);
    if constexpr (K == qkind::FP8_UE8M0)
        reinterpret_cast<uint32_t *>(codes)[c4] = c0 | (c1 << 8) | (c2 << 16) | (c3 << 24);
    else
        reinterpret_cast<uint16_t *>(codes)[c4] = uint16_t(c0 | (c1 << 4) | (c2 << 8) | (c3 << 12));
    if (c4 % lanes == 0) scales[c4 / lanes] = s.code;
}

// unpack_quad in two halves, for readers that issue a quad's loads long before they decode it
// (attention's key fetches): the quad's codes as one word, and the values of a word of codes
// under its block's scale byte.
template <qkind K>
__device__ __forceinline__ uint32_t quad_codes(const uint8_t *codes, int64_t c4) {
    return K == qkind::FP8_UE8M0 ? reinterpret_cast<const uint32_t *>(codes)[c4]
                                 : uint32_t(reinterpret_cast<const uint16_t *>(codes)[c4]);
}
template <qkind K>
__device__ __forceinline__ float4 quad_values(uint32_t c, uint8_t scale) {
    const float s = scale_value(K, scale);
    constexpr int bits = K == qkind::FP8_UE8M0 ? 8 : 4;
    constexpr uint32_t mask = (1u << bits) - 1;
    return make_float4(value_of<K>(uint8_t(c & mask), s), value_of<K>(uint8_t((c >> bits) & mask), s),
                       value_of<K>(uint8_t((c >> 2 * bits) & mask), s), value_of<K>(uint8_t((c >> 3 * bits) & mask), s));
}

// The exact values pack_quad stored for channels 4 c4 .. 4 c4 + 3 of a packed row.
template <qkind K>
__device__ __forceinline__ float4 unpack_quad(const uint8_t *codes, const uint8_t *scales, int64_t c4, int lanes) {
    return quad_values<K>(quad_codes<K>(codes, c4), scales[c4 / lanes]);
}

}  // namespace ds41rt::backend::cuda::dev
