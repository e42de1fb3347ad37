// Element types and their exact conversions.
//
// Every storage type the checkpoints use, with conversions to and from fp32 that are exact where
// the value is representable and round to nearest, ties to even, where it is not. These are the
// rounding points of the model's numerics (bf16 activations, FP8 E4M3 weights and activations,
// E8M0 power-of-two scales, FP4 E2M1 experts and cache entries), so they must be bit-exact: the
// tests compare them with tables produced by ml_dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ds41rt {

enum class dtype : uint8_t {
    F32 = 0,
    F64,
    F16,
    BF16,
    F8_E4M3,  // e4m3fn: no inf, 0x7f/0xff NaN, max 448
    F8_E8M0,  // unsigned power of two 2^(e-127), 0xff NaN
    F4_E2M1,  // two codes per byte, low nibble = even element
    I8,
    U8,
    I16,
    I32,
    I64,
    BOOL,
};

// Bits per element (F4_E2M1 is 4; everything else a whole number of bytes times 8).
int dtype_bits(dtype t);
// Bytes for n elements (F4_E2M1 rounds up: an odd count leaves the last high nibble as padding).
size_t dtype_bytes(dtype t, size_t n);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", "F8_E8M0", "F4", ...).
std::string_view dtype_name(dtype t);
// Parses a safetensors dtype string; false for an unknown one.
bool dtype_from_name(std::string_view name, dtype *out);

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- bf16 -------------------------------------------------------------------------------------
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
uint16_t f32_to_bf16(float f);  // RNE; NaN stays NaN (quiet)
// Round an fp32 value to the nearest bf16 value (the model's bf16 rounding points).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- fp16 -------------------------------------------------------------------------------------
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // RNE, overflow to inf

// ---- FP8 E4M3 (fn) ----------------------------------------------------------------------------
float e4m3_to_f32(uint8_t v);
// RNE. saturate=true clamps finite overflow to +-448 (cvt.rn.satfinite, the kernels' cast);
// saturate=false maps values that round beyond 448 to NaN (torch's .to(float8_e4m3fn)).
uint8_t f32_to_e4m3(float f, bool saturate = true);
inline float round_e4m3(float f, bool saturate = true) { return e4m3_to_f32(f32_to_e4m3(f, saturate)); }

// ---- E8M0 (unsigned exponent) -----------------------------------------------------------------
float e8m0_to_f32(uint8_t v);     // 2^(v-127); 0xff -> NaN
// Round to the nearest power of two; a tie (exactly 1.5 * 2^k) rounds up, as ml_dtypes'
// float8_e8m0fnu does. Zero, negatives, inf and NaN map to 0xff (NaN).
uint8_t f32_to_e8m0(float f);

// ---- FP4 E2M1 ---------------------------------------------------------------------------------
// Magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; bit 3 is the sign; no inf or NaN.
float e2m1_to_f32(uint8_t code);  // code in 0..15
uint8_t f32_to_e2m1(float f);     // RNE, saturating at +-6; NaN -> +6 is not defined: maps to 0x7
inline float round_e2m1(float f) { return e2m1_to_f32(f32_to_e2m1(f)); }
// Element i of a packed FP4 row: low nibble holds the even element.
inline uint8_t e2m1_unpack(const uint8_t *packed, size_t i) {
    return (i & 1) ? uint8_t(packed[i >> 1] >> 4) : uint8_t(packed[i >> 1] & 0xf);
}

// Converts n elements of type t at src to fp32 (for F4_E2M1, n counts elements).
void to_f32(dtype t, const void *src, float *dst, size_t n);

}  // namespace ds41rt
