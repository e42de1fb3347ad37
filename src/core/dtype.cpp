#include "core/dtype.h"

#include <cmath>
#include <limits>

namespace ds41rt {

namespace {
struct dtype_info {
    dtype t;
    int bits;
    std::string_view name;
};
constexpr dtype_info DTYPES[] = {
    {dtype::F32, 32, "F32"},         {dtype::F64, 64, "F64"},         {dtype::F16, 16, "F16"},
    {dtype::BF16, 16, "BF16"},       {dtype::F8_E4M3, 8, "F8_E4M3"},  {dtype::F8_E8M0, 8, "F8_E8M0"},
    {dtype::F4_E2M1, 4, "F4"},       {dtype::I8, 8, "I8"},            {dtype::U8, 8, "U8"},
    {dtype::I16, 16, "I16"},         {dtype::I32, 32, "I32"},         {dtype::I64, 64, "I64"},
    {dtype::BOOL, 8, "BOOL"},
};
}  // namespace

int dtype_bits(dtype t) {
    for (const auto &d : DTYPES)
        if (d.t == t) return d.bits;
    return 0;
}

size_t dtype_bytes(dtype t, size_t n) { return (n * size_t(dtype_bits(t)) + 7) / 8; }

std::string_view dtype_name(dtype t) {
    for (const auto &d : DTYPES)
        if (d.t == t) return d.name;
    return "?";
}

bool dtype_from_name(std::string_view name, dtype *out) {
    for (const auto &d : DTYPES) {
        if (d.name == name) {
            *out = d.t;
            return true;
        }
    }
    return false;
}

uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        // Subnormal: man * 2^-24, exact in fp32.
        float v = float(man) * std::ldexp(1.0f, -24);
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = uint16_t((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
    if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: inf
    if (a < 0x38800000u) {
        // Result is subnormal or zero: value / 2^-24 rounded to an integer, RNE.
        float v = f32_from_bits(a) * 16777216.0f;  // exact scaling by 2^24
        float r = std::nearbyint(v);                 // default rounding mode is RNE
        return uint16_t(sign | uint16_t(r));
    }
    uint32_t exp = (a >> 23) - 112;
    uint32_t man = a & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return uint16_t(sign | h);
}

float e4m3_to_f32(uint8_t v) {
    uint32_t sign = v & 0x80;
    uint32_t exp = (v >> 3) & 0xf;
    uint32_t man = v & 0x7;
    float r;
    if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
    if (exp == 0)
        r = float(man) * 0.001953125f;  // man/8 * 2^-6
    else
        r = std::ldexp(1.0f + float(man) / 8.0f, int(exp) - 7);
    return sign ? -r : r;
}

uint8_t f32_to_e4m3(float f, bool saturate) {
    if (std::isnan(f)) return 0x7f;
    uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    float a = std::fabs(f);
    // Largest finite is 448 (mantissa 6); the next step, 480, would have the odd mantissa 7, so
    // the tie at 464 rounds down to 448 and only values above 464 overflow.
    if (a > 464.0f) return saturate ? uint8_t(sign | 0x7e) : uint8_t(sign | 0x7f);
    if (a > 448.0f) return uint8_t(sign | 0x7e);
    // Quantum: subnormal range (< 2^-6) has step 2^-9; otherwise step 2^(e-3).
    int e;
    std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    int exp_unbiased = e - 1;
    if (exp_unbiased < -6) exp_unbiased = -6;
    float step = std::ldexp(1.0f, exp_unbiased - 3);
    float q = std::nearbyint(a / step);  // exact division by a power of two; RNE
    float v = q * step;
    if (v == 0.0f) return sign;
    // Re-encode v (exactly representable now).
    int e2;
    std::frexp(v, &e2);
    int ue = e2 - 1;
    if (ue < -6) {
        return uint8_t(sign | uint8_t(v / 0.001953125f));
    }
    uint32_t man = uint32_t(std::ldexp(v, -ue) * 8.0f) - 8u;
    return uint8_t(sign | uint8_t((ue + 7) << 3) | uint8_t(man));
}

float e8m0_to_f32(uint8_t v) {
    if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, int(v) - 127);
}

uint8_t f32_to_e8m0(float f) {
    // E8M0 has no zero and no sign: ml_dtypes maps zero, negatives, inf and NaN to NaN (0xff).
    if (!(f > 0.0f) || std::isinf(f)) return 0xff;
    int e;
    float m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1): f = (2m) * 2^(e-1)
    int k = e - 1;                // f = (2m) * 2^k with 2m in [1, 2)
    float mm = 2.0f * m;
    if (mm >= 1.5f) k++;  // no mantissa bits: ties round up, as ml_dtypes does
    int code = k + 127;
    if (code < 0) return 0x00;
    if (code > 254) return 0xff;
    return uint8_t(code);
}

namespace {
constexpr float E2M1_VALUES[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
}

float e2m1_to_f32(uint8_t code) {
    float v = E2M1_VALUES[code & 7];
    return (code & 8) ? -v : v;
}

uint8_t f32_to_e2m1(float f) {
    uint8_t sign = std::signbit(f) ? 8 : 0;
    float a = std::fabs(f);
    if (std::isnan(f)) return 0x7;
    // Midpoints between consecutive magnitudes; at a tie pick the even code.
    static constexpr float MID[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    uint8_t c = 0;
    while (c < 7 && (a > MID[c] || (a == MID[c] && (c & 1)))) c++;
    return uint8_t(sign | c);
}

void to_f32(dtype t, const void *src, float *dst, size_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(src);
    switch (t) {
    case dtype::F32: std::memcpy(dst, src, n * 4); return;
    case dtype::F64:
        for (size_t i = 0; i < n; i++) { double d; std::memcpy(&d, b + 8 * i, 8); dst[i] = float(d); }
        return;
    case dtype::F16:
        for (size_t i = 0; i < n; i++) { uint16_t h; std::memcpy(&h, b + 2 * i, 2); dst[i] = f16_to_f32(h); }
        return;
    case dtype::BF16:
        for (size_t i = 0; i < n; i++) { uint16_t h; std::memcpy(&h, b + 2 * i, 2); dst[i] = bf16_to_f32(h); }
        return;
    case dtype::F8_E4M3: for (size_t i = 0; i < n; i++) dst[i] = e4m3_to_f32(b[i]); return;
    case dtype::F8_E8M0: for (size_t i = 0; i < n; i++) dst[i] = e8m0_to_f32(b[i]); return;
    case dtype::F4_E2M1: for (size_t i = 0; i < n; i++) dst[i] = e2m1_to_f32(e2m1_unpack(b, i)); return;
    case dtype::I8: for (size_t i = 0; i < n; i++) dst[i] = float(int8_t(b[i])); return;
    case dtype::U8:
    case dtype::BOOL: for (size_t i = 0; i < n; i++) dst[i] = float(b[i]); return;
    case dtype::I16:
        for (size_t i = 0; i < n; i++) { int16_t v; std::memcpy(&v, b + 2 * i, 2); dst[i] = float(v); }
        return;
    case dtype::I32:
        for (size_t i = 0; i < n; i++) { int32_t v; std::memcpy(&v, b + 4 * i, 4); dst[i] = float(v); }
        return;
    case dtype::I64:
        for (size_t i = 0; i < n; i++) { int64_t v; std::memcpy(&v, b + 8 * i, 8); dst[i] = float(v); }
        return;
    }
}

}  // namespace ds41rt
