// The official numerics' quantization points (V4.1 spec section 3), checked on values worked out
// by hand from the spec's formulas: scale selection, every rounding tie, and saturation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

using namespace ds41rt::backend::cpu;

static std::vector<float> block32(std::initializer_list<float> head, float fill = 0.0f) {
    std::vector<float> v(32, fill);
    std::copy(head.begin(), head.end(), v.begin());
    return v;
}

TEST(cpu_quant, pow2_ceil_from_float_bits) {
    EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
    EXPECT_EQ(pow2_ceil(std::nextafter(1.0f, 2.0f)), 2.0f);
    EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
    EXPECT_EQ(pow2_ceil(0.125f), 0.125f);
    EXPECT_EQ(pow2_ceil(3e-5f), std::ldexp(1.0f, -15));  // 3e-5 in (2^-16, 2^-15]
}

TEST(cpu_quant, fp8_act_quant_scale_and_ties) {
    // amax 300 -> 300/448 in (0.5, 1] -> scale 1: values land on the e4m3 grid directly.
    // 17 is the tie between 16 (mantissa 0) and 18 (mantissa 1): even -> 16.
    // 19 is the tie between 18 (mantissa 1) and 20 (mantissa 2): even -> 20.
    // 3*2^-10 is the subnormal tie between 2^-9 (m=1) and 2^-8 (m=2): -> 2^-8.
    // 300 itself: step 32 in [256, 512), 300 is between 288 and 320 -> 288.
    auto v = block32({300.0f, 17.0f, 19.0f, 3.0f * std::ldexp(1.0f, -10), -17.0f, 0.3f});
    fake_quant_fp8_ue8m0(v.data(), 1, 32, 32);
    EXPECT_EQ(v[0], 288.0f);
    EXPECT_EQ(v[1], 16.0f);
    EXPECT_EQ(v[2], 20.0f);
    EXPECT_EQ(v[3], std::ldexp(1.0f, -8));
    EXPECT_EQ(v[4], -16.0f);
    EXPECT_EQ(v[5], 0.3125f);  // step 2^-5 in [0.25, 0.5): 0.3 -> 0.3125
}

TEST(cpu_quant, fp8_act_quant_power_of_two_scale) {
    // amax 57 -> 57/448 = 0.127 -> scale 2^-2; 57/0.25 = 228 -> step 16 in [128, 256) -> 224 -> 56.
    auto v = block32({57.0f, 1.0f});
    fake_quant_fp8_ue8m0(v.data(), 1, 32, 32);
    EXPECT_EQ(v[0], 56.0f);
    EXPECT_EQ(v[1], 1.0f);
    // amax exactly 56 -> 56/448 = 2^-3 exactly -> scale 2^-3; 56/0.125 = 448 stays.
    auto u = block32({56.0f, -56.0f});
    fake_quant_fp8_ue8m0(u.data(), 1, 32, 32);
    EXPECT_EQ(u[0], 56.0f);
    EXPECT_EQ(u[1], -56.0f);
    // An all-zero block uses the 1e-4 floor and stays zero (no NaN from a zero scale).
    auto z = block32({});
    fake_quant_fp8_ue8m0(z.data(), 1, 32, 32);
    for (float x : z) EXPECT_EQ(x, 0.0f);
}

TEST(cpu_quant, fp8_blocks_are_independent) {
    // Two blocks of 32: the second's large value must not change the first's scale.
    std::vector<float> v(64, 0.0f);
    v[0] = 18.0f;   // block 0, amax 18 -> scale 2^-4 (18/448 in (2^-5, 2^-4]); 18/2^-4 = 288 exact
    v[32] = 300.0f;
    v[33] = 17.0f;  // block 1, scale 1 -> tie -> 16
    fake_quant_fp8_ue8m0(v.data(), 1, 64, 32);
    EXPECT_EQ(v[0], 18.0f);
    EXPECT_EQ(v[33], 16.0f);
}

TEST(cpu_quant, fp4_ue8m0_ties_and_scale) {
    // amax 6 -> scale 2^ceil(log2(1)) = 1. Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    auto v = block32({6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -5.0f, -0.75f});
    fake_quant_fp4_ue8m0(v.data(), 1, 32, 32);
    const float want[] = {6, 0, 1, 1, 2, 2, 4, 4, -4, -1};
    for (int i = 0; i < 10; i++) EXPECT_EQ(v[i], want[i]) << i;
    // amax 7 -> 7/6 -> scale 2; 7/2 = 3.5 -> tie -> 4 -> 8; 1 -> 0.5 -> 0.5 -> 1.
    auto u = block32({7.0f, 1.0f});
    fake_quant_fp4_ue8m0(u.data(), 1, 32, 32);
    EXPECT_EQ(u[0], 8.0f);
    EXPECT_EQ(u[1], 1.0f);
}

TEST(cpu_quant, fp4_e4m3_scale_is_not_a_power_of_two_and_saturates) {
    // Block 16. amax 7 -> 7/6 = 1.1667 -> e4m3 (step 0.125 in [1, 2)) -> 1.125.
    // 7 / 1.125 = 6.22 -> clamp 6 -> 6.75. 1 / 1.125 = 0.889 -> 1 -> 1.125.
    std::vector<float> v(16, 0.0f);
    v[0] = 7.0f;
    v[1] = 1.0f;
    fake_quant_fp4_e4m3(v.data(), 1, 16, 16);
    EXPECT_FLOAT_EQ(v[0], 6.75f);
    EXPECT_FLOAT_EQ(v[1], 1.125f);
    // amax 5376 -> 896 -> saturating e4m3 cast gives 448; 5376/448 = 12 -> clamp 6 -> 2688.
    std::vector<float> w(16, 0.0f);
    w[0] = 5376.0f;
    fake_quant_fp4_e4m3(w.data(), 1, 16, 16);
    EXPECT_EQ(w[0], 2688.0f);
    // Tiny block: amax floored at 6*2^-9 -> scale 2^-9 exactly.
    std::vector<float> t(16, 0.0f);
    t[0] = 3.0f * std::ldexp(1.0f, -9);
    fake_quant_fp4_e4m3(t.data(), 1, 16, 16);
    EXPECT_EQ(t[0], 3.0f * std::ldexp(1.0f, -9));
}

TEST(cpu_quant, rope_tail_rotates_pairs_and_inverse_undoes_it) {
    // dim 6 with 2 pairs: channels 0,1 pass through; (2,3) and (4,5) rotate.
    float x[6] = {1, 2, 1, 0, 0, 1};
    const float c[2] = {0.0f, 0.0f}, s[2] = {1.0f, 1.0f};  // 90 degrees
    rope_tail(x, 1, 6, c, s, 2, false);
    EXPECT_FLOAT_EQ(x[0], 1);
    EXPECT_FLOAT_EQ(x[1], 2);
    EXPECT_FLOAT_EQ(x[2], 0);   // (1 + 0i) * i = i
    EXPECT_FLOAT_EQ(x[3], 1);
    EXPECT_FLOAT_EQ(x[4], -1);  // (0 + 1i) * i = -1
    EXPECT_FLOAT_EQ(x[5], 0);
    rope_tail(x, 1, 6, c, s, 2, true);
    EXPECT_FLOAT_EQ(x[2], 1);
    EXPECT_FLOAT_EQ(x[5], 1);
}
