// V4 official-numerics ops (spec deepseek-v4-flash.md 2.1, 3.4, 3.5, 3.8) on values worked out by
// hand: the Walsh-Hadamard transform (explicit H2 / H4, natural order, orthogonality at d=128),
// the FP8 QAT of the nope dims only (block 64, the rope tail untouched), the indexer's
// Hadamard + FP4 quantization point, and the bf16 per-head q norm.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/routed.h"

using namespace ds41rt::backend::cpu;

TEST(cpu_ops, hadamard_h2) {
    // H2 = [[1, 1], [1, -1]]: (3, 1) -> (4, 2), times the scale.
    float x[2] = {3.0f, 1.0f};
    hadamard_transform(x, 1, 2, 1.0f);
    EXPECT_EQ(x[0], 4.0f);
    EXPECT_EQ(x[1], 2.0f);
    float y[2] = {3.0f, 1.0f};
    hadamard_transform(y, 1, 2, 0.5f);
    EXPECT_EQ(y[0], 2.0f);
    EXPECT_EQ(y[1], 1.0f);
}

TEST(cpu_ops, hadamard_h4_natural_order) {
    // Sylvester H4 = [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]].
    // H4 (1, 2, 3, 4) = (10, -2, -4, 0); scale 4^-0.5 = 1/2 -> (5, -1, -2, 0).
    // Two rows at once: the second, (1, 0, 0, 0), is column 0 = all ones / 2.
    float x[8] = {1, 2, 3, 4, 1, 0, 0, 0};
    hadamard_transform(x, 2, 4, 0.5f);
    const float want[8] = {5, -1, -2, 0, 0.5f, 0.5f, 0.5f, 0.5f};
    for (int i = 0; i < 8; i++) EXPECT_EQ(x[i], want[i]) << i;
    // Column j of H4 is e_j's transform: e_1 -> (1, -1, 1, -1), e_2 -> (1, 1, -1, -1), e_3 -> (1, -1, -1, 1).
    const float cols[3][4] = {{1, -1, 1, -1}, {1, 1, -1, -1}, {1, -1, -1, 1}};
    for (int j = 1; j < 4; j++) {
        float e[4] = {0, 0, 0, 0};
        e[j] = 1;
        hadamard_transform(e, 1, 4, 1.0f);
        for (int i = 0; i < 4; i++) EXPECT_EQ(e[i], cols[j - 1][i]) << j << "," << i;
    }
}

TEST(cpu_ops, hadamard_128_entries_and_orthogonality) {
    const int d = 128;
    const float s = 1.0f / std::sqrt(float(d));
    // H[i][j] = (-1)^popcount(i & j) (natural order), checked column by column; then H.H = I:
    // transforming a column again with the same scale gives back e_j.
    for (int j = 0; j < d; j++) {
        std::vector<float> e(d, 0.0f);
        e[size_t(j)] = 1.0f;
        hadamard_transform(e.data(), 1, d, 1.0f);
        for (int i = 0; i < d; i++) {
            const float want = (std::popcount(unsigned(i & j)) % 2) ? -1.0f : 1.0f;
            ASSERT_EQ(e[size_t(i)], want) << i << "," << j;
        }
        for (float &v : e) v *= s;
        hadamard_transform(e.data(), 1, d, s);
        for (int i = 0; i < d; i++) ASSERT_NEAR(e[size_t(i)], i == j ? 1.0f : 0.0f, 1e-6f) << i << "," << j;
    }
    // A general vector survives the round trip (orthogonal, scale d^-0.5 both ways).
    std::vector<float> x(d), y(d);
    for (int i = 0; i < d; i++) x[size_t(i)] = y[size_t(i)] = std::sin(0.37f * float(i)) * float(i % 7 + 1);
    hadamard_transform(y.data(), 1, d, s);
    double nx = 0, ny = 0;
    for (int i = 0; i < d; i++) {
        nx += double(x[size_t(i)]) * x[size_t(i)];
        ny += double(y[size_t(i)]) * y[size_t(i)];
    }
    EXPECT_NEAR(ny, nx, 1e-4 * nx);  // norm preserved
    hadamard_transform(y.data(), 1, d, s);
    for (int i = 0; i < d; i++) EXPECT_NEAR(y[size_t(i)], x[size_t(i)], 1e-5f) << i;
}

TEST(cpu_ops, fp8_qat_nope_dims_only_block64) {
    // Window KV / main compressor entries: head 128 = 64 nope + 64 rope; FP8 (ue8m0) on the nope
    // dims in blocks of 64, the rope tail left exactly as it was.
    const int hd = 128, nope = 64;
    std::vector<float> kv(2 * hd, 0.0f);
    // Row 0: amax 300 -> 300/448 in (0.5, 1] -> scale 1. 300 -> 288 (step 32 in [256, 512)),
    // 17 -> 16 and 19 -> 20 (ties to even mantissa), 0.3 -> 0.3125 (step 2^-5 in [0.25, 0.5)).
    kv[0] = 300.0f;
    kv[1] = 17.0f;
    kv[2] = 19.0f;
    kv[40] = 0.3f;
    kv[64] = 17.0f;    // rope dims: untouched
    kv[65] = 0.3f;
    kv[127] = 1000.0f;
    // Row 1: amax 57 -> 57/448 = 0.127 -> scale 2^-2; 57/0.25 = 228 -> 224 -> 56. Channel 40
    // (the second 32-channel half of the block) shares that scale: 0.0013/0.25 = 0.0052 is an
    // e4m3 subnormal (step 2^-9): 2.66 steps -> 3 -> 3 * 2^-9 * 0.25 = 0.00146484375. With its
    // own block of 32 it would get scale 2^-18 and 0.0013427734375 instead.
    kv[hd + 0] = 57.0f;
    kv[hd + 1] = 1.0f;
    kv[hd + 40] = 0.0013f;
    kv[hd + 64] = 57.0f;
    kv[hd + 100] = 0.0013f;
    fake_quant_fp8_ue8m0_cols(kv.data(), 2, hd, nope, 64);
    EXPECT_EQ(kv[0], 288.0f);
    EXPECT_EQ(kv[1], 16.0f);
    EXPECT_EQ(kv[2], 20.0f);
    EXPECT_EQ(kv[40], 0.3125f);
    EXPECT_EQ(kv[64], 17.0f);
    EXPECT_EQ(kv[65], 0.3f);
    EXPECT_EQ(kv[127], 1000.0f);
    EXPECT_EQ(kv[hd + 0], 56.0f);
    EXPECT_EQ(kv[hd + 1], 1.0f);
    EXPECT_EQ(kv[hd + 40], 0.00146484375f);
    EXPECT_EQ(kv[hd + 64], 57.0f);
    EXPECT_EQ(kv[hd + 100], 0.0013f);
}

TEST(cpu_ops, indexer_hadamard_then_fp4) {
    const int d = 128;
    // e_0: H e_0 / sqrt(128) = 0.0883883 everywhere -> bf16 181/128 * 2^-4 = 0.08837890625.
    // FP4 block 32: amax/6 = 0.01473 -> scale 2^-6; 0.08837890625 * 64 = 5.65625 -> e2m1 6
    // -> 6 * 2^-6 = 0.09375.
    std::vector<float> a(d, 0.0f);
    a[0] = 1.0f;
    rotate_fake_quant_fp4_ue8m0(a.data(), 1, d, 32);
    for (int i = 0; i < d; i++) ASSERT_EQ(a[size_t(i)], 0.09375f) << i;
    // 3 e_0 + e_1: (H x)_i = 3 + (-1)^i -> 4 (even i), 2 (odd i); / sqrt(128) -> bf16 0.353515625
    // and 0.1767578125. Each block of 32 has amax 0.353515625 -> /6 = 0.0589 -> scale 2^-4:
    // 5.65625 -> 6 -> 0.375 and 2.828125 -> 3 -> 0.1875.
    std::vector<float> b(d, 0.0f);
    b[0] = 3.0f;
    b[1] = 1.0f;
    rotate_fake_quant_fp4_ue8m0(b.data(), 1, d, 32);
    for (int i = 0; i < d; i++) ASSERT_EQ(b[size_t(i)], i % 2 ? 0.1875f : 0.375f) << i;
    // 3 e_0 - e_64: column 64 is +1 for i < 64, -1 after -> 2 on the first half, 4 on the second.
    // Blocks 0-1 (amax 0.1767578125 -> /6 = 0.0295 -> scale 2^-5): 5.65625 -> 6 -> 0.1875;
    // blocks 2-3 as above: 0.375. Each block of 32 picks its own scale.
    std::vector<float> c(d, 0.0f);
    c[0] = 3.0f;
    c[64] = -1.0f;
    rotate_fake_quant_fp4_ue8m0(c.data(), 1, d, 32);
    for (int i = 0; i < d; i++) ASSERT_EQ(c[size_t(i)], i < 64 ? 0.1875f : 0.375f) << i;
}

TEST(cpu_ops, q_head_rms_norm_in_bf16) {
    // (1, 1, 3, 5): squares 1, 1, 9, 25 (bf16-exact), mean 9, + 1e-6 -> bf16 9, rsqrt 1/3 ->
    // bf16 171/512 = 0.333984375. Products in bf16: 1 -> 0.333984375; 3 -> 1.001953125 -> 1.0;
    // 5 -> 1.669921875 -> 214/128 = 1.671875. (The fp32 norm would give 5/3 -> 1.6640625.)
    float x[4] = {1, 1, 3, 5};
    rms_norm_unweighted_bf16(x, 1, 4, 1e-6f);
    EXPECT_EQ(x[0], 0.333984375f);
    EXPECT_EQ(x[1], 0.333984375f);
    EXPECT_EQ(x[2], 1.0f);
    EXPECT_EQ(x[3], 1.671875f);
    // 1.0078125^2 = 1.01568603515625 -> bf16 1.015625; mean over 4 = 0.25390625; rsqrt
    // 1.98455... -> bf16 254/128 = 1.984375; 1.0078125 * 1.984375 = 1.99987... -> bf16 2.
    float y[4] = {1.0078125f, 0, 0, 0};
    rms_norm_unweighted_bf16(y, 1, 4, 1e-6f);
    EXPECT_EQ(y[0], 2.0f);
    EXPECT_EQ(y[1], 0.0f);
}

// The router's [S, K] output as a route table: row offsets, the picks in pick order, a dropped
// pick (-1) left out and its row shorter.
TEST(cpu_ops, route_table_from_router_output) {
    const int32_t ids[] = {5, 2, 7, -1, 0, 3};
    const float w[] = {0.5f, 0.25f, 1.0f, 9.0f, 0.125f, 2.0f};
    const ds41rt::backend::cpu::route_table rt = ds41rt::backend::cpu::route_table_from(ids, w, 3, 2);
    ASSERT_EQ(rt.rows(), 3);
    EXPECT_EQ(rt.offsets, (std::vector<uint32_t>{0, 2, 3, 5}));
    ASSERT_EQ(rt.routes.size(), 5u);
    const uint32_t want_e[] = {5, 2, 7, 0, 3};
    const float want_w[] = {0.5f, 0.25f, 1.0f, 0.125f, 2.0f};
    for (size_t i = 0; i < 5; i++) {
        EXPECT_EQ(rt.routes[i].expert, want_e[i]) << i;
        EXPECT_EQ(rt.routes[i].weight, want_w[i]) << i;
    }
}
