// EXL3 decoding against the spec's test vectors (shared/specs/quant-formats.md section 2.4, marked
// [V] there: produced by exllamav3's own decode_3inst<cb> / pack / reconstruct kernels on an H200
// at turboderp-org/exllamav3 @ 4f8ad01), plus the bitstream rules of section 2.3 for every K,
// checked through an independent packer written here from the recurrence form of the state.
// Bit-exactness against exllamav3's get_weight_tensor() for K = 1..8 and all codebooks is the job
// of quant_fixture_test.cpp once the producer fixtures exist.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/quant_ops.h"
#include "core/dtype.h"
#include "model/exl3.h"

namespace ds41rt::model {
namespace {

TEST(exl3, codebook_test_vectors) {
    // state, 3INST, MCG, MUL1 (fp16 bits), spec quant-formats 2.4.
    const uint16_t v[][4] = {
        {0x0000, 0x3a25, 0x3f60, 0xc2e8}, {0x0001, 0xbb5b, 0x304e, 0x3921}, {0x0002, 0x3b74, 0xba13, 0xb72d},
        {0x0003, 0x34b6, 0x3ab8, 0x3239}, {0x1234, 0xc066, 0x3e0f, 0xb89e}, {0x8000, 0xb7f8, 0xb915, 0xbaf2},
        {0xffff, 0xb110, 0x3acd, 0xb936},
    };
    int ok = 0;
    for (const auto &r : v) {
        EXPECT_EQ(exl3_codebook_value(r[0], exl3_codebook::INST3), r[1]) << std::hex << r[0];
        EXPECT_EQ(exl3_codebook_value(r[0], exl3_codebook::MCG), r[2]) << std::hex << r[0];
        EXPECT_EQ(exl3_codebook_value(r[0], exl3_codebook::MUL1), r[3]) << std::hex << r[0];
        ok += (exl3_codebook_value(r[0], exl3_codebook::INST3) == r[1]) +
              (exl3_codebook_value(r[0], exl3_codebook::MCG) == r[2]) + (exl3_codebook_value(r[0], exl3_codebook::MUL1) == r[3]);
    }
    std::printf("exl3 codebook vectors bit-exact: %d / 21\n", ok);
}

// Statistics over all 65,536 states (spec 2.4): std 1.2437 (3INST), 1.2441 (MCG), 1.0003 (MUL1);
// MUL1 range [-3.45, 3.35]. Every value finite.
TEST(exl3, codebook_statistics) {
    const double want_std[3] = {1.2437, 1.2441, 1.0003};
    for (int cb = 0; cb < 3; cb++) {
        double s = 0, s2 = 0, lo = 1e9, hi = -1e9;
        for (uint32_t st = 0; st < 65536; st++) {
            const double x = f16_to_f32(exl3_codebook_value(uint16_t(st), exl3_codebook(cb)));
            ASSERT_TRUE(std::isfinite(x));
            s += x;
            s2 += x * x;
            lo = std::min(lo, x);
            hi = std::max(hi, x);
        }
        const double mean = s / 65536, sd = std::sqrt(s2 / 65536 - mean * mean);
        EXPECT_NEAR(sd, want_std[cb], 6e-4) << "codebook " << cb;
        if (cb == 2) {
            EXPECT_NEAR(lo, -3.45, 0.01);
            EXPECT_NEAR(hi, 3.35, 0.01);
        }
    }
}

// Spec 2.4 "K=2 tile test vector": u16 words i*0x9E37 + 0x1234; element 0 at (0,0) has state
// 0x729a, element 7 at (9,8) state 0xb06b, element 255 at (15,15) state 0x9ca6 (MCG 0xb342,
// 0x3e72, 0xbd3e).
TEST(exl3, k2_tile_test_vector) {
    uint16_t words[32];
    for (int i = 0; i < 32; i++) words[i] = uint16_t(i * 0x9E37 + 0x1234);
    EXPECT_EQ(words[1], 0xb06b);
    EXPECT_EQ(words[4], 0x8b10);
    uint16_t tile[256];
    exl3_decode_tile(words, 2, exl3_codebook::MCG, tile);
    EXPECT_EQ(tile[0 * 16 + 0], 0xb342);
    EXPECT_EQ(tile[9 * 16 + 8], 0x3e72);
    EXPECT_EQ(tile[15 * 16 + 15], 0xbd3e);
    EXPECT_EQ(exl3_codebook_value(0x729a, exl3_codebook::MCG), 0xb342);
    EXPECT_EQ(exl3_codebook_value(0xb06b, exl3_codebook::MCG), 0x3e72);
    EXPECT_EQ(exl3_codebook_value(0x9ca6, exl3_codebook::MCG), 0xbd3e);
    // The same states through the other codebooks: the position map and window do not depend on it.
    exl3_decode_tile(words, 2, exl3_codebook::MUL1, tile);
    EXPECT_EQ(tile[9 * 16 + 8], exl3_codebook_value(0xb06b, exl3_codebook::MUL1));
}

// An independent packer from spec 2.3's second form: symbols v_0..v_255 of K bits, concatenated
// MSB-first into a stream, stream bit p at bit 31 - p%32 of uint32 p/32, each uint32 stored as
// two int16 with the low half first; state_t = ((state_{t-1} << K) | v_t) & 0xFFFF, tail-biting.
void pack(const std::vector<uint32_t> &sym, int k, uint16_t *words) {
    std::vector<uint32_t> w32(size_t(8 * k), 0);
    int p = 0;
    for (uint32_t s : sym)
        for (int b = k - 1; b >= 0; b--, p++)
            if ((s >> b) & 1) w32[size_t(p / 32)] |= 1u << (31 - p % 32);
    for (int i = 0; i < 8 * k; i++) {
        words[2 * i] = uint16_t(w32[size_t(i)] & 0xffff);
        words[2 * i + 1] = uint16_t(w32[size_t(i)] >> 16);
    }
}

TEST(exl3, every_k_decodes_the_recurrence_states) {
    std::mt19937 rng(7);
    for (int k = 1; k <= 8; k++) {
        for (int cb = 0; cb < 3; cb++) {
            std::vector<uint32_t> sym(256);
            for (auto &s : sym) s = rng() & ((1u << k) - 1);
            uint16_t words[128];
            pack(sym, k, words);
            // Tail-biting: state_0 includes the last symbols. Run the recurrence twice around.
            std::vector<uint32_t> state(256);
            uint32_t st = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int t = 0; t < 256; t++) {
                    st = ((st << k) | sym[size_t(t)]) & 0xffff;
                    state[size_t(t)] = st;
                }
            uint16_t tile[256];
            exl3_decode_tile(words, k, exl3_codebook(cb), tile);
            int ok = 0;
            for (int t = 0; t < 256; t++) {
                const int lane = t / 8, j = t % 8;
                const int r = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1), c = lane / 4 + 8 * (j >> 2);
                ok += tile[r * 16 + c] == exl3_codebook_value(uint16_t(state[size_t(t)]), exl3_codebook(cb));
            }
            EXPECT_EQ(ok, 256) << "K=" << k << " codebook " << cb;
        }
    }
}

// Spec 2.3 position examples: t = 0..7 -> (0,0),(1,0),(8,0),(9,0),(0,8),(1,8),(8,8),(9,8); t = 8
// -> (2,0); t = 255 -> (15,15). Symbols chosen so each element's state is unique at K = 8.
TEST(exl3, element_positions) {
    std::vector<uint32_t> sym(256);
    for (int t = 0; t < 256; t++) sym[size_t(t)] = uint32_t(t);
    uint16_t words[128];
    pack(sym, 8, words);
    uint16_t tile[256];
    exl3_decode_tile(words, 8, exl3_codebook::MCG, tile);
    const int pos[][2] = {{0, 0}, {1, 0}, {8, 0}, {9, 0}, {0, 8}, {1, 8}, {8, 8}, {9, 8}, {2, 0}};
    for (int t = 0; t < 9; t++) {
        const uint16_t state = uint16_t(((t == 0 ? 255u : uint32_t(t - 1)) << 8) | uint32_t(t));
        EXPECT_EQ(tile[pos[t][0] * 16 + pos[t][1]], exl3_codebook_value(state, exl3_codebook::MCG)) << t;
    }
    EXPECT_EQ(tile[15 * 16 + 15], exl3_codebook_value(uint16_t((254u << 8) | 255u), exl3_codebook::MCG));
}

// W = diag(suh) H What H diag(svh) (spec 2.5) against a dense fp64 product with the explicit
// H[i][j] = (-1)^popcount(i & j) / sqrt(128); and the layer forward y = x W.
TEST(exl3, dequantize_and_forward_match_dense_rotations) {
    const int64_t in = 256, out = 128;
    const int k = 3;
    std::mt19937 rng(11);
    std::vector<uint16_t> trellis(size_t(in / 16 * out / 16 * 16 * k)), suh(static_cast<size_t>(in)), svh(static_cast<size_t>(out));
    for (auto &w : trellis) w = uint16_t(rng());
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (auto &s : suh) s = f32_to_f16((rng() & 1 ? -1.0f : 1.0f) * u(rng) * 0.01f);
    for (auto &s : svh) s = f32_to_f16((rng() & 1 ? -1.0f : 1.0f) * u(rng));
    svh[5] = 0;  // a zero output channel
    exl3_linear l{in, out, k, exl3_codebook::MUL1, trellis.data(), suh.data(), svh.data()};
    ASSERT_TRUE(exl3_check("t", l).is_ok());
    std::vector<uint16_t> what(size_t(in * out));
    exl3_decode(l, what.data());
    std::vector<float> w(size_t(in * out));
    exl3_dequantize(l, w.data());

    auto h = [](int64_t i, int64_t j) { return (__builtin_popcountll(uint64_t(i & j)) & 1 ? -1.0 : 1.0) / std::sqrt(128.0); };
    // T = H_left What (block-diagonal on the input axis), then W = diag(suh) T H_right diag(svh).
    std::vector<double> t(size_t(in * out), 0.0);
    for (int64_t r = 0; r < in; r++)
        for (int64_t c = 0; c < out; c++) {
            double s = 0;
            for (int64_t q = r / 128 * 128; q < r / 128 * 128 + 128; q++) s += h(r % 128, q % 128) * f16_to_f32(what[size_t(q * out + c)]);
            t[size_t(r * out + c)] = s;
        }
    double max_rel = 0;
    for (int64_t r = 0; r < in; r++)
        for (int64_t c = 0; c < out; c++) {
            double s = 0;
            for (int64_t q = c / 128 * 128; q < c / 128 * 128 + 128; q++) s += t[size_t(r * out + q)] * h(q % 128, c % 128);
            const double ref = f16_to_f32(suh[size_t(r)]) * s * f16_to_f32(svh[size_t(c)]);
            max_rel = std::max(max_rel, std::fabs(ref - w[size_t(r * out + c)]) / (std::fabs(ref) + 1e-30));
            if (c == 5) {
                EXPECT_EQ(w[size_t(r * out + c)], 0.0f);
            }
        }
    EXPECT_LT(max_rel, 1e-6);

    const int64_t m = 3;
    std::vector<float> x(size_t(m * in)), y(size_t(m * out)), whatf(what.size());
    for (auto &v : x) v = u(rng) - 1.0f;
    for (size_t i = 0; i < what.size(); i++) whatf[i] = f16_to_f32(what[i]);
    std::vector<float> suhf(static_cast<size_t>(in)), svhf(static_cast<size_t>(out));
    for (int64_t i = 0; i < in; i++) suhf[size_t(i)] = f16_to_f32(suh[size_t(i)]);
    for (int64_t i = 0; i < out; i++) svhf[size_t(i)] = f16_to_f32(svh[size_t(i)]);
    backend::cpu::exl3_linear(x.data(), m, whatf.data(), in, out, suhf.data(), svhf.data(), y.data());
    double err = 0, norm = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < out; c++) {
            double ref = 0;
            for (int64_t i = 0; i < in; i++) ref += double(x[size_t(r * in + i)]) * w[size_t(i * out + c)];
            err += (ref - y[size_t(r * out + c)]) * (ref - y[size_t(r * out + c)]);
            norm += ref * ref;
        }
    EXPECT_LT(std::sqrt(err / norm), 1e-6);
}

TEST(exl3, check_refuses_bad_tensors) {
    std::vector<uint16_t> trellis(size_t(8 * 8 * 32)), suh(128, 0x3c00), svh(128, 0x3c00);
    exl3_linear l{128, 128, 2, exl3_codebook::MCG, trellis.data(), suh.data(), svh.data()};
    EXPECT_TRUE(exl3_check("p", l).is_ok());
    suh[17] = 0x7e00;  // NaN
    Status st = exl3_check("layers.0.ffn.experts.1.w2", l);
    EXPECT_NE(st.message().find("layers.0.ffn.experts.1.w2.suh[17]"), std::string::npos) << st.message();
    suh[17] = 0x3c00;
    l.out = 96;
    EXPECT_FALSE(exl3_check("p", l).is_ok());
}

}  // namespace
}  // namespace ds41rt::model
