// The CPU reference fill (backend/cpu/dummy_values) of the quantized publications' routed experts
// at V4.1 shapes: NVFP4 (E2M1 codes, E4M3 per-16 scales, weight_scale_2, input_scale) dequantized
// by model/nvfp4 and EXL3 (K=2 trellis, suh / svh) dequantized by model/exl3 with the Hadamard
// rotations, both decoders independent of the fill. Checked: finite values of the target std
// (NVFP4 within 0.5% of the encoding's exact expectation; EXL3 within 0.5% of the expectation for
// the svh magnitudes the fill drew and 3% of the one over random draws), zero mean, no
// NaN scale byte, scalars as ModelOpt defines them (input_scale = amax / 2688), the same bytes for
// the same (seed, id) and others for another, windows equal to that range of the whole fill.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "backend/cpu/dummy_values.h"
#include "dummy_stats.h"
#include "model/dummy_weights.h"
#include "model/exl3.h"
#include "model/nvfp4.h"

using namespace ds41rt;
using backend::cpu::dummy_format;
using backend::cpu::dummy_tensor_desc;
using testing_util::dummy_bytes_host;
using testing_util::dummy_desc;

namespace {

dummy_bytes_host host_fill(const dummy_tensor_desc &d, uint64_t seed) {
    dummy_bytes_host f;
    auto b = backend::cpu::dummy_bytes(d);
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    if (!b.is_ok()) return f;
    f.w.assign(b.value().weight, 0xff);
    f.s.assign(b.value().scale, 0xff);
    Status st = backend::cpu::fill_dummy_host(d, f.w.data(), f.s.data(), seed);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return f;
}

dummy_tensor_desc nvfp4_desc(int64_t out, int64_t in, uint64_t id) {
    dummy_tensor_desc d = dummy_desc(dummy_format::NVFP4, out, in, 16, 1 / std::sqrt(double(in)), id);
    d.block_out = 1;
    d.input_amax = model::DUMMY_NVFP4_INPUT_AMAX;
    return d;
}

dummy_tensor_desc exl3_desc(int64_t out, int64_t in, uint64_t id) {
    dummy_tensor_desc d = dummy_desc(dummy_format::EXL3, out, in, 128, 1 / std::sqrt(double(in)), id);
    d.exl3_bits = 2;
    d.exl3_code_rms = model::exl3_codebook_rms(model::exl3_codebook::MCG);
    return d;
}

void check_nvfp4(int64_t out, int64_t in, const char *what) {
    const dummy_tensor_desc d = nvfp4_desc(out, in, 77);
    auto enc = backend::cpu::dummy_encoding_for(d);
    ASSERT_TRUE(enc.is_ok()) << enc.status().to_string();
    const dummy_bytes_host f = host_fill(d, 42);
    ASSERT_EQ(f.w.size(), size_t(out * in / 2));
    ASSERT_EQ(f.s.size(), size_t(out * in / 16));
    std::set<uint8_t> scales(f.s.begin(), f.s.end());
    EXPECT_EQ(scales.size(), 8u) << what << ": the eight E4M3 block scales 0x34..0x3b";
    EXPECT_EQ(*scales.begin(), 0x34);
    EXPECT_EQ(*scales.rbegin(), 0x3b);
    model::nvfp4_linear l;
    l.out = out;
    l.in = in;
    l.codes = f.w.data();
    l.scales = f.s.data();
    l.weight_scale_2 = enc.value().weight_scale_2;
    l.input_scale = enc.value().input_scale;
    Status st = model::nvfp4_check(what, l);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(l.input_scale, float(16.0 / 2688.0));  // ModelOpt: amax / (6 * 448)
    std::vector<float> w(size_t(out * in));
    model::nvfp4_dequantize(l, w.data());
    const testing_util::moments m = testing_util::stats(w);
    EXPECT_EQ(m.non_finite, 0u) << what;
    EXPECT_LT(std::fabs(m.mean), 0.01 * d.std) << what;
    EXPECT_NEAR(m.std, enc.value().expected_std, 0.005 * enc.value().expected_std) << what;
    EXPECT_NEAR(m.std, d.std, 0.03 * d.std) << what;
    // The test's own dequantization (core/dtype decoders) agrees with model/nvfp4's.
    const std::vector<float> v = testing_util::dummy_dequant(d, f);
    EXPECT_TRUE(v == w) << what;
    const dummy_bytes_host again = host_fill(d, 42), other = host_fill(d, 43);
    EXPECT_TRUE(again.w == f.w && again.s == f.s) << what << ": same seed, other bytes";
    EXPECT_LT(double(testing_util::equal_bytes(other.w, f.w)), 0.2 * double(f.w.size())) << what;
    std::printf("[ info ] NVFP4 %s [%lld, %lld]: target std %.6g, expected %.6g, measured mean %.3g std %.6g "
                "(%+.3f%%); weight_scale_2 %.6g, input_scale %.6g\n",
                what, (long long)out, (long long)in, d.std, enc.value().expected_std, m.mean, m.std,
                100 * (m.std / d.std - 1), l.weight_scale_2, l.input_scale);
}

TEST(dummy_quant_values, nvfp4_v41_experts) {
    check_nvfp4(2304, 5120, "w1");
    check_nvfp4(5120, 2304, "w2");
}

TEST(dummy_quant_values, exl3_codebook_rms_matches_the_spec) {
    // quant-formats 2.4 (measured over all 65,536 states by the spec's author against exllamav3):
    // std 1.2437 (3INST), 1.2441 (MCG), 1.0003 (MUL1); the means are ~0, so RMS ~ std.
    EXPECT_NEAR(model::exl3_codebook_rms(model::exl3_codebook::INST3), 1.2437, 2e-3);
    EXPECT_NEAR(model::exl3_codebook_rms(model::exl3_codebook::MCG), 1.2441, 2e-3);
    EXPECT_NEAR(model::exl3_codebook_rms(model::exl3_codebook::MUL1), 1.0003, 2e-3);
}

void check_exl3(int64_t out, int64_t in, const char *what) {
    const dummy_tensor_desc d = exl3_desc(out, in, 78);
    auto enc = backend::cpu::dummy_encoding_for(d);
    ASSERT_TRUE(enc.is_ok()) << enc.status().to_string();
    const dummy_bytes_host f = host_fill(d, 42);
    ASSERT_EQ(f.w.size(), size_t(in / 16 * out / 16 * 32 * 2));  // trellis [in/16, out/16, 32] int16
    ASSERT_EQ(f.s.size(), size_t(2 * (in + out)));                // suh [in], svh [out] fp16
    model::exl3_linear l;
    l.in = in;
    l.out = out;
    l.k = 2;
    l.cb = model::exl3_codebook::MCG;
    l.trellis = reinterpret_cast<const uint16_t *>(f.w.data());
    l.suh = reinterpret_cast<const uint16_t *>(f.s.data());
    l.svh = l.suh + in;
    Status st = model::exl3_check(what, l);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    size_t neg_u = 0, neg_v = 0;
    for (int64_t i = 0; i < in; i++) neg_u += l.suh[i] >> 15;
    for (int64_t j = 0; j < out; j++) neg_v += l.svh[j] >> 15;
    EXPECT_NEAR(double(neg_u) / double(in), 0.5, 0.05) << what << ": suh signs";
    EXPECT_NEAR(double(neg_v) / double(out), 0.5, 0.05) << what << ": svh signs";
    const testing_util::moments m = testing_util::stats(testing_util::dummy_dequant(d, f));
    EXPECT_EQ(m.non_finite, 0u) << what;
    EXPECT_LT(std::fabs(m.mean), 0.01 * d.std) << what;
    // The expectation over random svh magnitudes, and the one for the magnitudes this fill drew:
    // a^2 mean(svh^2) code_rms^2 (the rotations are orthonormal; What's states are uniform).
    double sv2 = 0;
    for (int64_t j = 0; j < out; j++) sv2 += double(f16_to_f32(l.svh[j])) * f16_to_f32(l.svh[j]) / double(out);
    const double drawn = double(f16_to_f32(enc.value().suh_bits)) * std::sqrt(sv2) * d.exl3_code_rms;
    EXPECT_NEAR(m.std, drawn, 0.005 * drawn) << what;
    EXPECT_NEAR(m.std, enc.value().expected_std, 0.03 * enc.value().expected_std) << what;
    EXPECT_NEAR(m.std, d.std, 0.03 * d.std) << what;
    const dummy_bytes_host again = host_fill(d, 42), other = host_fill(d, 43);
    EXPECT_TRUE(again.w == f.w && again.s == f.s) << what << ": same seed, other bytes";
    EXPECT_LT(double(testing_util::equal_bytes(other.w, f.w)), 0.05 * double(f.w.size())) << what;
    std::printf("[ info ] EXL3 K=2 MCG %s [out %lld, in %lld]: target std %.6g, expected %.6g (for the drawn svh %.6g), "
                "measured mean %.3g std %.6g (%+.3f%% vs target, %+.3f%% vs drawn); |suh| %.6g\n",
                what, (long long)out, (long long)in, d.std, enc.value().expected_std, drawn, m.mean, m.std,
                100 * (m.std / d.std - 1), 100 * (m.std / drawn - 1), double(f16_to_f32(enc.value().suh_bits)));
}

TEST(dummy_quant_values, exl3_v41_experts) {
    check_exl3(2304, 5120, "w1");
    check_exl3(1024, 2304, "w2 (first 1024 outputs)");  // the input axis of w2; fewer outputs keep it quick
}

// TP slices: w1 / w3 cut the output axis (trellis dim 1, svh), w2 the input axis (dim 0, suh).
TEST(dummy_quant_values, windows_equal_the_whole_tensor) {
    const dummy_tensor_desc e = exl3_desc(512, 384, 5);
    const dummy_bytes_host whole = host_fill(e, 9);
    const uint16_t *wt = reinterpret_cast<const uint16_t *>(whole.w.data());
    const uint16_t *ws = reinterpret_cast<const uint16_t *>(whole.s.data());
    for (auto [r0, nr, c0, nc] : {std::array<int64_t, 4>{128, 256, 0, -1}, std::array<int64_t, 4>{0, -1, 256, 128},
                                  std::array<int64_t, 4>{384, 128, 128, 128}}) {
        dummy_tensor_desc w = e;
        w.row0 = r0;
        w.nrows = nr;
        w.col0 = c0;
        w.ncols = nc;
        const dummy_bytes_host part = host_fill(w, 9);
        const int64_t rows = nr < 0 ? e.rows - r0 : nr, cols = nc < 0 ? e.cols - c0 : nc;
        const uint16_t *pt = reinterpret_cast<const uint16_t *>(part.w.data());
        const uint16_t *ps = reinterpret_cast<const uint16_t *>(part.s.data());
        size_t bad = 0;
        for (int64_t a = 0; a < cols / 16; a++)
            for (int64_t b = 0; b < rows / 16; b++)
                bad += std::memcmp(pt + (a * (rows / 16) + b) * 32,
                                   wt + ((c0 / 16 + a) * (e.rows / 16) + r0 / 16 + b) * 32, 64) != 0;
        for (int64_t i = 0; i < cols; i++) bad += ps[i] != ws[c0 + i];
        for (int64_t j = 0; j < rows; j++) bad += ps[cols + j] != ws[e.cols + r0 + j];
        EXPECT_EQ(bad, 0u) << "EXL3 window rows " << r0 << " cols " << c0;
    }
    const dummy_tensor_desc n = nvfp4_desc(64, 256, 6);
    const dummy_bytes_host nw = host_fill(n, 9);
    dummy_tensor_desc win = n;
    win.row0 = 8;
    win.nrows = 16;
    win.col0 = 48;  // one 16-block off a 32 boundary
    win.ncols = 80;
    const dummy_bytes_host np = host_fill(win, 9);
    size_t bad = 0;
    for (int64_t r = 0; r < 16; r++) {
        bad += std::memcmp(np.w.data() + r * 40, nw.w.data() + (8 + r) * 128 + 24, 40) != 0;
        bad += std::memcmp(np.s.data() + r * 5, nw.s.data() + (8 + r) * 16 + 3, 5) != 0;
    }
    EXPECT_EQ(bad, 0u) << "NVFP4 window";
}

TEST(dummy_quant_values, refuses_bad_descriptors_by_name) {
    dummy_tensor_desc e = exl3_desc(2304, 5120, 1);
    e.name = "layers.0.ffn.experts.3.w1.weight";
    e.rows = 2300;  // not whole Hadamard blocks
    auto r = backend::cpu::dummy_bytes(e);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("layers.0.ffn.experts.3.w1.weight"), std::string::npos) << r.status().message();
    e.rows = 2304;
    e.exl3_code_rms = 0;  // the codebook's RMS is the caller's to give
    EXPECT_FALSE(backend::cpu::dummy_bytes(e).is_ok());
    e.exl3_code_rms = 1.2;
    e.exl3_bits = 9;
    EXPECT_FALSE(backend::cpu::dummy_bytes(e).is_ok());
    e.exl3_bits = 2;
    e.col0 = 64;  // a window off the 128 grid
    EXPECT_FALSE(backend::cpu::dummy_bytes(e).is_ok());
    dummy_tensor_desc n = nvfp4_desc(64, 40, 2);  // 40 inputs: not whole 16-blocks
    EXPECT_FALSE(backend::cpu::dummy_bytes(n).is_ok());
    n = nvfp4_desc(64, 64, 2);
    n.input_amax = 0;
    EXPECT_FALSE(backend::cpu::dummy_bytes(n).is_ok());
}

}  // namespace
