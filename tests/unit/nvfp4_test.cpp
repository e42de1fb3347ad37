// NVFP4: decoding against the format definitions written here (spec quant-formats 1.1; not
// core/dtype.h), the producer's activation quantization on hand-worked blocks (ModelOpt 0.47
// fp4_fake_quant_block: see backend/cpu/quant_ops.cpp for the formula and its source), and the
// W4A4 layer and expert against direct evaluation of their definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/quant_ops.h"
#include "core/dtype.h"
#include "model/nvfp4.h"

namespace ds41rt::model {
namespace {

// ModelOpt decodes the -0 code (8) as +0: tests/fixtures/quant-nvfp4 (its own dequantize) has no
// negative zeros where the codes hold 284 of them.
float ref_e2m1(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    if (code == 8) return 0.0f;
    return (code & 8) ? -mag[code & 7] : mag[code & 7];
}
float ref_e4m3(uint8_t v) {
    int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float mag = exp == 0 ? std::ldexp(float(man) / 8.0f, -6) : std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
    return sign ? -mag : mag;
}

TEST(nvfp4, dequantize_matches_definition_bitwise) {
    const int64_t out = 5, in = 64;
    std::mt19937 rng(3);
    std::vector<uint8_t> codes(size_t(out * in / 2)), scales(size_t(out * in / 16));
    for (auto &c : codes) c = uint8_t(rng());
    for (auto &s : scales) {
        do s = uint8_t(rng() & 0x7f);  // ModelOpt scales are >= 0
        while (s == 0x7f);
    }
    scales[0] = 0x01;  // smallest subnormal 2^-9
    scales[1] = 0x7e;  // 448
    scales[2] = 0x38;  // 1.0
    nvfp4_linear l{out, in, codes.data(), scales.data(), 0.0123f, 0.5f};
    ASSERT_TRUE(nvfp4_check("p", l).is_ok());
    std::vector<float> w(size_t(out * in));
    nvfp4_dequantize(l, w.data());
    int bad = 0;
    for (int64_t r = 0; r < out; r++)
        for (int64_t k = 0; k < in; k++) {
            const uint8_t byte = codes[size_t(r * in / 2 + k / 2)];
            const uint8_t code = (k % 2 == 0) ? (byte & 0xf) : (byte >> 4);  // low nibble = even input
            const float block = ref_e4m3(scales[size_t(r * in / 16 + k / 16)]) * l.weight_scale_2;
            const float want = ref_e2m1(code) * block;
            bad += std::memcmp(&want, &w[size_t(r * in + k)], 4) != 0;
        }
    EXPECT_EQ(bad, 0);
}

TEST(nvfp4, check_refuses_nan_scales_and_bad_scalars) {
    std::vector<uint8_t> codes(16), scales(2, 0x38);
    nvfp4_linear l{1, 32, codes.data(), scales.data(), 1.0f, 1.0f};
    EXPECT_TRUE(nvfp4_check("p", l).is_ok());
    scales[1] = 0x7f;
    Status st = nvfp4_check("layers.2.ffn.experts.9.w3", l);
    EXPECT_NE(st.message().find("layers.2.ffn.experts.9.w3.weight_scale: NaN byte 0x7f at row 0 block 1"), std::string::npos)
        << st.message();
    scales[1] = 0xff;
    EXPECT_FALSE(nvfp4_check("p", l).is_ok());
    scales[1] = 0x38;
    l.input_scale = 0;
    st = nvfp4_check("q", l);
    EXPECT_NE(st.message().find("q.input_scale"), std::string::npos) << st.message();
    l.input_scale = 1;
    l.weight_scale_2 = std::nanf("");
    st = nvfp4_check("q", l);
    EXPECT_NE(st.message().find("q.weight_scale_2"), std::string::npos) << st.message();
}

// input_scale 1/6 makes the block scale e4m3(amax) * (1/6): with amax = 6 it is exactly 1, so the
// E2M1 grid and its ties show directly (ModelOpt's fp4_round_magnitude: ties to the even code).
// Inputs are bf16 values (the quantizer casts to bf16 first), e.g. 5.03125 rather than 5.01.
TEST(nvfp4, activation_quant_hand_values) {
    const float gs = 1.0f / 6.0f;
    float x[32] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.26f, -0.74f, 5.03125f, -6.0f, 0.0f, -0.0f, 2.9f, 1.1f,
                   // block 2: amax 0 -> the scale is replaced by 1 and everything stays 0
                   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const float want[16] = {6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -0.5f, -0.5f, 6.0f, -6.0f, 0.0f, 0.0f, 3.0f, 1.0f};
    // Scale: e4m3(6 / (6 * gs)) * gs = e4m3(6) / 6 = 1 (6 * gs rounds to exactly 1 in fp32).
    backend::cpu::nvfp4_fake_quant_act(x, 1, 32, gs, /*out_bf16=*/false);
    for (int i = 0; i < 16; i++) EXPECT_EQ(x[i], want[i]) << i;
    for (int i = 16; i < 32; i++) EXPECT_EQ(x[i], 0.0f) << i;
}

// A block scale that is not a power of two: amax 7 with input_scale 1/6 gives e4m3(7) = 7 (exact),
// s = 7 / 6 in fp32, and the codes are those of |x| / s. A tiny block whose e4m3 scale underflows to 0 is replaced by s = 1 (ModelOpt's `>= 1e-5` guard).
TEST(nvfp4, activation_quant_scale_rounding_and_underflow) {
    const float gs = 1.0f / 6.0f;
    const float s = 7.0f * gs;
    float x[32] = {};
    x[0] = 7.0f;
    x[1] = 3.4f * s;
    x[2] = -1.2f * s;
    for (int i = 16; i < 32; i++) x[i] = 1e-9f;
    const float x2 = x[2];
    backend::cpu::nvfp4_fake_quant_act(x, 1, 32, gs, false);
    EXPECT_EQ(x[0], 6.0f * s);
    EXPECT_EQ(x[1], 3.0f * s);
    EXPECT_EQ(x[2], -1.0f * s) << x2;
    for (int i = 16; i < 32; i++) EXPECT_EQ(x[i], 0.0f);
    // out_bf16 rounds the written value to bf16 (ModelOpt writes in the input dtype).
    float y[16] = {1.0f, 0.7f};
    backend::cpu::nvfp4_fake_quant_act(y, 1, 16, 1.0f / 2688.0f, true);
    for (float v : y) EXPECT_EQ(v, round_bf16(v));
}

// The layer and the expert are their definitions: fake-quantize, fp64 products, bf16 staging.
TEST(nvfp4, w4a4_linear_and_expert_follow_definition) {
    const int64_t m = 3, dim = 32, inter = 48;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](std::vector<float> &v, float sc) {
        for (auto &x : v) x = round_bf16(nd(rng) * sc);
    };
    std::vector<float> x(size_t(m * dim)), w1(size_t(inter * dim)), w3(w1.size()), w2(size_t(dim * inter));
    fill(x, 2.0f);
    fill(w1, 0.1f);
    fill(w3, 0.1f);
    fill(w2, 0.1f);
    const float is13 = 7.0f / 2688.0f, is2 = 1.5f / 2688.0f, L = 1.0f;
    std::vector<float> y(size_t(m * dim));
    backend::cpu::nvfp4_w4a4_swiglu(x.data(), m, dim, inter, w1.data(), w3.data(), w2.data(), is13, is2, L, y.data());

    std::vector<float> xq = x;
    backend::cpu::nvfp4_fake_quant_act(xq.data(), m, dim, is13, true);
    std::vector<float> h(size_t(m * inter));
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < inter; j++) {
            double g = 0, u = 0;
            for (int64_t k = 0; k < dim; k++) {
                g += double(xq[size_t(r * dim + k)]) * w1[size_t(j * dim + k)];
                u += double(xq[size_t(r * dim + k)]) * w3[size_t(j * dim + k)];
            }
            const float gf = std::min(float(g), L), uf = std::clamp(float(u), -L, L);
            h[size_t(r * inter + j)] = round_bf16(gf / (1.0f + std::exp(-gf)) * uf);
        }
    backend::cpu::nvfp4_fake_quant_act(h.data(), m, inter, is2, true);
    double err = 0, norm = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t d = 0; d < dim; d++) {
            double o = 0;
            for (int64_t j = 0; j < inter; j++) o += double(h[size_t(r * inter + j)]) * w2[size_t(d * inter + j)];
            err += (o - y[size_t(r * dim + d)]) * (o - y[size_t(r * dim + d)]);
            norm += o * o;
        }
    EXPECT_LT(std::sqrt(err / norm), 1e-5);
    EXPECT_GT(norm, 0.0);
}

}  // namespace
}  // namespace ds41rt::model
