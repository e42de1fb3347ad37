// Device twins of the rounding points in core/dtype and backend/cpu/ops (pow2_ceil, bf16, E4M3,
// E2M1, E8M0): each written so it returns the same bits as the host function for every finite
// input, because the cache quantizers built on them must match the CPU reference bit for bit.
// Arithmetic that the host does in separate fp32 steps is written with __f*_rn intrinsics here,
// so nvcc cannot contract it into an FMA (which rounds once where the host rounds twice).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace ds41rt::backend::cuda::dev {

// 2^ceil(log2(v)) for normal v > 0, from the bits as backend/cpu pow2_ceil computes it.
__device__ __forceinline__ float pow2_ceil(float v) {
    const uint32_t bits = __float_as_uint(v);
    const int e = int((bits >> 23) & 0xffu) + ((bits & 0x7fffffu) != 0 ? 1 : 0);
    return __int_as_float(e << 23);
}
// The E8M0 code of a power of two (pow2_ceil's results are normal: 2^-126 .. 2^127).
__device__ __forceinline__ uint8_t e8m0_code(float pow2) { return uint8_t(__float_as_uint(pow2) >> 23); }
// Decode as core e8m0_to_f32 does for every code: 2^(code - 127), code 0 being the subnormal
// 2^-127 (checkpoint scales may hold it) and 0xff NaN.
// Selects, not branches: decode kernels run this per weight block (a branch per scale cost the
// MXFP4 GEMV ~10 instructions and a reconvergence each, ncu 2026-12-01).
__device__ __forceinline__ float e8m0_value(uint32_t code) {
    uint32_t bits = code << 23;
    bits = code == 0 ? 0x00400000u : bits;
    bits = code == 0xff ? 0x7fc00000u : bits;
    return __uint_as_float(bits);
}
// Byte B of a word of four E8M0 codes as 2^(code - 127) from the code's bits alone (a shift and a
// mask: the MXFP4 GEMV decodes two such scales per 16 x 32 block, where a decode with e8m0_value's
// edge cases and a folded power of two cost five instructions each). Exact for codes 1..254; code 0
// gives 0 instead of 2^-127 (a block that small is below fp32 resolution in any sum it joins) and
// 0xff inf instead of NaN (the output is still poisoned).
template <int B>
__device__ __forceinline__ float e8m0_byte_value(uint32_t w) {
    static_assert(B >= 0 && B <= 3, "byte 0..3");
    return __uint_as_float((B == 3 ? w >> 1 : w << (23 - 8 * B)) & 0x7f800000u);
}
// bf16 round to nearest even (core round_bf16): __float2bfloat16_rn is cvt.rn.bf16.f32.
__device__ __forceinline__ float round_bf16(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }
__device__ __forceinline__ uint16_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float bf16_value(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

// E4M3 (fn) round to nearest even, saturating at +-448: cvt.rn.satfinite.e4m3x2.f32, the same
// conversion gemv.cu uses for official activations. Host twin: f32_to_e4m3(f, saturate = true).
__device__ __forceinline__ uint8_t e4m3_code(float f) { return uint8_t(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)); }
__device__ __forceinline__ float e4m3_value(uint8_t c) {
    // Exact decode: sign, 4-bit exponent (bias 7), 3-bit mantissa; subnormals man * 2^-9.
    // (0x7f / 0xff are NaN; the quantizers never produce them.)
    const uint32_t exp = (c >> 3) & 0xfu, man = c & 7u;
    const float a = exp == 0 ? float(man) * 0.001953125f : __uint_as_float(((exp + 120u) << 23) | (man << 20));
    return (c & 0x80u) ? -a : a;
}

// E2M1 round to nearest even over {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating (core f32_to_e2m1):
// sm_90 has no FP4 convert instruction, so the midpoints are compared as the host does.
__device__ __forceinline__ uint8_t e2m1_code(float f) {
    const uint8_t sign = (__float_as_uint(f) >> 31) ? 8 : 0;
    const float a = fabsf(f);
    uint8_t c;
    if (a < 0.25f) c = 0;
    else if (a <= 0.75f) c = (a == 0.25f) ? 0 : (a == 0.75f ? 2 : 1);
    else if (a < 1.25f) c = 2;
    else if (a <= 1.75f) c = (a == 1.25f) ? 2 : (a == 1.75f ? 4 : 3);
    else if (a < 2.5f) c = 4;
    else if (a <= 3.5f) c = (a == 2.5f) ? 4 : (a == 3.5f ? 6 : 5);
    else if (a < 5.0f) c = 6;
    else c = (a == 5.0f) ? 6 : 7;
    return uint8_t(sign | c);
}
__device__ __forceinline__ float e2m1_value(uint8_t c) {
    const uint32_t m = c & 7u;
    // codes 0..7: 0, .5, 1, 1.5, 2, 3, 4, 6 = (m < 2 ? m / 2 : (2 + (m & 1)) * 2^((m >> 1) - 2))
    const float a = m < 2 ? 0.5f * float(m) : float(2u + (m & 1u)) * __int_as_float(int((m >> 1) - 2 + 127) << 23);
    return (c & 8u) ? -a : a;
}

}  // namespace ds41rt::backend::cuda::dev
