// Exact dtype conversions against tables from ml_dtypes / numpy (tools/reference/dtype_tables.py;
// the generating versions are on the first line of dtype_tables.inc).
#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

namespace {
#include "dtype_tables.inc"
}

using namespace ds41rt;

static bool same_float(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return f32_bits(a) == f32_bits(b);
}

TEST(dtype, e4m3_decode_matches_ml_dtypes) {
    for (int c = 0; c < 256; c++)
        EXPECT_TRUE(same_float(e4m3_to_f32(uint8_t(c)), f32_from_bits(E4M3_DECODE[c]))) << "code " << c;
}

TEST(dtype, e8m0_decode_matches_ml_dtypes) {
    for (int c = 0; c < 256; c++)
        EXPECT_TRUE(same_float(e8m0_to_f32(uint8_t(c)), f32_from_bits(E8M0_DECODE[c]))) << "code " << c;
}

TEST(dtype, e2m1_decode_matches_ml_dtypes) {
    for (int c = 0; c < 16; c++)
        EXPECT_TRUE(same_float(e2m1_to_f32(uint8_t(c)), f32_from_bits(E2M1_DECODE[c]))) << "code " << c;
}

TEST(dtype, e4m3_encode_rne_matches_ml_dtypes) {
    // ml_dtypes' cast does not saturate: overflow is NaN, as saturate=false.
    for (size_t i = 0; i < sizeof(E4M3_PROBE_IN) / 4; i++) {
        float x = f32_from_bits(E4M3_PROBE_IN[i]);
        uint8_t got = f32_to_e4m3(x, /*saturate=*/false);
        uint8_t want = E4M3_PROBE_OUT[i];
        if ((want & 0x7f) == 0x7f) {
            EXPECT_EQ(got & 0x7f, 0x7f) << "x=" << x;
        } else {
            EXPECT_EQ(got, want) << "x=" << x;
        }
    }
}

TEST(dtype, e4m3_saturating_cast_clamps_to_448) {
    EXPECT_EQ(f32_to_e4m3(1e6f, true), 0x7e);
    EXPECT_EQ(f32_to_e4m3(-465.0f, true), 0xfe);
    EXPECT_EQ(f32_to_e4m3(464.0f, true), 0x7e);   // tie rounds to the even mantissa: 448
    EXPECT_EQ(f32_to_e4m3(464.5f, false), 0x7f);  // beyond the tie: NaN without saturation
}

TEST(dtype, e2m1_encode_rne_matches_ml_dtypes) {
    for (size_t i = 0; i < sizeof(E2M1_PROBE_IN) / 4; i++) {
        float x = f32_from_bits(E2M1_PROBE_IN[i]);
        EXPECT_EQ(f32_to_e2m1(x), E2M1_PROBE_OUT[i]) << "x=" << x;
    }
}

TEST(dtype, e2m1_ties_from_spec) {
    // V4.1 spec section 3: tie points 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    const float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const float out[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
    for (int i = 0; i < 7; i++) {
        EXPECT_EQ(round_e2m1(in[i]), out[i]);
        EXPECT_EQ(round_e2m1(-in[i]), -out[i]);
    }
}

TEST(dtype, e8m0_encode_matches_ml_dtypes) {
    for (size_t i = 0; i < sizeof(E8M0_PROBE_IN) / 4; i++) {
        float x = f32_from_bits(E8M0_PROBE_IN[i]);
        EXPECT_EQ(f32_to_e8m0(x), E8M0_PROBE_OUT[i]) << "x=" << x;
    }
}

TEST(dtype, bf16_and_f16_encode_match_reference) {
    for (size_t i = 0; i < sizeof(HALF_PROBE_IN) / 4; i++) {
        float x = f32_from_bits(HALF_PROBE_IN[i]);
        EXPECT_EQ(f32_to_bf16(x), BF16_PROBE_OUT[i]) << "x=" << x;
        EXPECT_EQ(f32_to_f16(x), F16_PROBE_OUT[i]) << "x=" << x;
        if (std::isfinite(f16_to_f32(F16_PROBE_OUT[i]))) {
            EXPECT_EQ(f32_to_f16(f16_to_f32(F16_PROBE_OUT[i])), F16_PROBE_OUT[i]);
        }
    }
}

TEST(dtype, packed_fp4_low_nibble_is_even_element) {
    const uint8_t packed[2] = {0x2f, 0x71};  // elements: 0xf, 0x2, 0x1, 0x7
    EXPECT_EQ(e2m1_unpack(packed, 0), 0xf);
    EXPECT_EQ(e2m1_unpack(packed, 1), 0x2);
    EXPECT_EQ(e2m1_unpack(packed, 2), 0x1);
    EXPECT_EQ(e2m1_unpack(packed, 3), 0x7);
    float out[4];
    to_f32(dtype::F4_E2M1, packed, out, 4);
    EXPECT_EQ(out[0], -6.0f);
    EXPECT_EQ(out[1], 1.0f);
    EXPECT_EQ(out[2], 0.5f);
    EXPECT_EQ(out[3], 6.0f);
}

TEST(dtype, names_round_trip) {
    for (dtype t : {dtype::F32, dtype::F64, dtype::F16, dtype::BF16, dtype::F8_E4M3, dtype::F8_E8M0,
                    dtype::F4_E2M1, dtype::I8, dtype::U8, dtype::I16, dtype::I32, dtype::I64, dtype::BOOL}) {
        dtype back;
        ASSERT_TRUE(dtype_from_name(dtype_name(t), &back));
        EXPECT_EQ(back, t);
    }
    dtype x;
    EXPECT_FALSE(dtype_from_name("F8_E5M3", &x));
    EXPECT_EQ(dtype_bytes(dtype::F4_E2M1, 5), 3u);
}
