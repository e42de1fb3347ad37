// The CPU reference of the dummy-weight fill (backend/cpu/dummy_values), whose bytes the GPU fill
// must equal: stored bytes dequantized with core/dtype's decoders give the target std (within
// 0.5% of the encoding's exact expectation, 3% of the target) and zero mean; no NaN code or scale;
// same (seed, id) same bytes, another id or seed other bytes; any block-aligned window is that
// range of the whole fill; bad descriptors are refused naming the tensor.
#include "backend/cpu/dummy_values.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "dummy_stats.h"

using namespace ds41rt;
using backend::cpu::dummy_dist;
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
    f.w.assign(b.value().weight, 0xff);  // 0xff: NaN in every format, so an unwritten byte shows
    f.s.assign(b.value().scale, 0xff);
    Status st = backend::cpu::fill_dummy_host(d, f.w.data(), f.s.data(), seed);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return f;
}

void check_quantized(const dummy_tensor_desc &d, const char *what) {
    auto enc = backend::cpu::dummy_encoding_for(d);
    ASSERT_TRUE(enc.is_ok()) << enc.status().to_string();
    const dummy_bytes_host f = host_fill(d, 42);
    const bool fp8 = d.format == dummy_format::FP8_BLOCK;
    size_t nan_codes = 0, bad_scales = 0, jitter[3] = {0, 0, 0};
    if (fp8)
        for (uint8_t b : f.w) nan_codes += (b & 0x7f) == 0x7f;
    for (uint8_t s : f.s) {
        const int j = int(s) - 127 - enc.value().scale_exp;
        if (j < 0 || j > (fp8 ? 2 : 0)) bad_scales++;
        else jitter[j]++;
    }
    EXPECT_EQ(nan_codes, 0u) << what;
    EXPECT_EQ(bad_scales, 0u) << what;
    if (fp8) {
        for (size_t c : jitter) EXPECT_GT(double(c), 0.25 * double(f.s.size())) << what << ": scale exponents uneven";
    }
    const testing_util::moments m = testing_util::stats(testing_util::dummy_dequant(d, f));
    EXPECT_EQ(m.non_finite, 0u) << what;
    EXPECT_LT(std::fabs(m.mean), 0.01 * d.std) << what;
    EXPECT_NEAR(m.std, enc.value().expected_std, 0.005 * enc.value().expected_std) << what;
    EXPECT_NEAR(m.std, d.std, 0.03 * d.std) << what;

    const dummy_bytes_host again = host_fill(d, 42);
    EXPECT_TRUE(again.w == f.w && again.s == f.s) << what << ": same seed and id, other bytes";
    dummy_tensor_desc other = d;
    other.id = d.id + 1;
    const dummy_bytes_host g = host_fill(other, 42), h = host_fill(d, 43);
    EXPECT_LT(double(testing_util::equal_bytes(g.w, f.w)), 0.2 * double(f.w.size())) << what << ": another id, same codes";
    EXPECT_LT(double(testing_util::equal_bytes(h.w, f.w)), 0.2 * double(f.w.size())) << what << ": another seed, same codes";
    std::printf("[ info ] %s [%lld, %lld]: target std %.6g, expected %.6g, measured mean %.3g std %.6g (%+.3f%% vs "
                "target), scale 2^%d, code std %.2f\n",
                what, (long long)d.rows, (long long)d.cols, d.std, enc.value().expected_std, m.mean, m.std,
                100 * (m.std / d.std - 1), enc.value().scale_exp, enc.value().code_std);
}

TEST(dummy_values, fp8_blocks_v41_grid) {  // a V4.1 projection's shape class, 32 x 32 blocks
    check_quantized(dummy_desc(dummy_format::FP8_BLOCK, 1024, 4096, 32, 1 / std::sqrt(4096.0), 7), "FP8 32x32");
}

TEST(dummy_values, fp8_blocks_v4_grid_uniform) {  // 128 x 128 blocks, uniform values
    dummy_tensor_desc d = dummy_desc(dummy_format::FP8_BLOCK, 2048, 1024, 128, 1 / std::sqrt(1024.0), 8);
    d.dist = dummy_dist::UNIFORM;
    check_quantized(d, "FP8 128x128 uniform");
}

TEST(dummy_values, engram_rows) {  // Engram table rows [rows, 256], one E8M0 per (row, 32)
    dummy_tensor_desc d = dummy_desc(dummy_format::FP8_BLOCK, 8192, 256, 32, 1.0, 9);
    d.block_out = 1;
    check_quantized(d, "FP8 1x32 Engram rows");
}

TEST(dummy_values, mxfp4_expert) {  // a V4.1 routed expert w1 [2304, 5120]
    check_quantized(dummy_desc(dummy_format::MXFP4, 2304, 1024, 32, 1 / std::sqrt(5120.0), 10), "MXFP4 w1 rows");
}

TEST(dummy_values, encoding_meets_the_target) {
    for (dummy_format f : {dummy_format::FP8_BLOCK, dummy_format::MXFP4})
        for (dummy_dist dist : {dummy_dist::NORMAL, dummy_dist::UNIFORM})
            for (double target : {1e-4, 1 / std::sqrt(5120.0), 0.3, 1.0, 40.0}) {
                dummy_tensor_desc d = dummy_desc(f, 64, 64, 32, target, 1);
                d.dist = dist;
                auto e = backend::cpu::dummy_encoding_for(d);
                ASSERT_TRUE(e.is_ok()) << e.status().to_string();
                EXPECT_NEAR(e.value().expected_std, target, (f == dummy_format::MXFP4 ? 0.02 : 0.005) * target)
                    << (f == dummy_format::MXFP4 ? "MXFP4" : "FP8") << " target " << target;
            }
    EXPECT_FALSE(backend::cpu::dummy_encoding_for(dummy_desc(dummy_format::FP8_BLOCK, 64, 64, 32, 1e-60, 1)).is_ok());
    dummy_tensor_desc c = dummy_desc(dummy_format::MXFP4, 64, 64, 32, 1, 1);
    c.dist = dummy_dist::CONSTANT;
    EXPECT_FALSE(backend::cpu::dummy_encoding_for(c).is_ok());
}

TEST(dummy_values, windows_equal_the_whole_tensor) {
    struct win {
        dummy_tensor_desc d;
        int64_t r0, nr, c0, nc;
    };
    const dummy_tensor_desc fp8 = dummy_desc(dummy_format::FP8_BLOCK, 384, 640, 128, 0.05, 1);  // 3 x 5 blocks
    const dummy_tensor_desc fp4 = dummy_desc(dummy_format::MXFP4, 40, 160, 32, 0.05, 2);
    const dummy_tensor_desc bf = dummy_desc(dummy_format::BF16, 33, 70, 1, 0.5, 3);
    const dummy_tensor_desc odd = dummy_desc(dummy_format::FP8_BLOCK, 100, 90, 32, 0.05, 4);  // partial blocks
    for (const win &t : {win{fp8, 128, 256, 128, 384}, win{fp8, 256, -1, 0, 128}, win{fp4, 5, 4, 64, 64},
                         win{fp4, 39, 1, 128, -1}, win{bf, 3, 7, 11, 13}, win{odd, 64, -1, 64, -1}}) {
        const dummy_bytes_host whole = host_fill(t.d, 5);
        dummy_tensor_desc w = t.d;
        w.row0 = t.r0;
        w.nrows = t.nr;
        w.col0 = t.c0;
        w.ncols = t.nc;
        const dummy_bytes_host part = host_fill(w, 5);
        const int64_t nr = t.nr < 0 ? t.d.rows - t.r0 : t.nr, nc = t.nc < 0 ? t.d.cols - t.c0 : t.nc;
        const bool fp4w = t.d.format == dummy_format::MXFP4;
        const int64_t esz = t.d.format == dummy_format::BF16 ? 2 : 1;
        size_t bad = 0;
        for (int64_t r = 0; r < nr; r++) {
            const int64_t row_bytes = fp4w ? nc / 2 : nc * esz, full_row = fp4w ? t.d.cols / 2 : t.d.cols * esz;
            const int64_t off = fp4w ? t.c0 / 2 : t.c0 * esz;
            bad += std::memcmp(part.w.data() + r * row_bytes, whole.w.data() + (t.r0 + r) * full_row + off,
                               size_t(row_bytes)) != 0;
        }
        EXPECT_EQ(bad, 0u) << "window rows " << t.r0 << " cols " << t.c0 << ": rows differ";
        if (t.d.format != dummy_format::BF16) {
            const int64_t bo = fp4w ? 1 : t.d.block_out, bi = fp4w ? 32 : t.d.block_in;
            const int64_t sc = (t.d.cols + bi - 1) / bi, wsr = (nr + bo - 1) / bo, wsc = (nc + bi - 1) / bi;
            ASSERT_EQ(part.s.size(), size_t(wsr * wsc));
            size_t sbad = 0;
            for (int64_t i = 0; i < wsr; i++)
                for (int64_t j = 0; j < wsc; j++)
                    sbad += part.s[size_t(i * wsc + j)] != whole.s[size_t((t.r0 / bo + i) * sc + t.c0 / bi + j)];
            EXPECT_EQ(sbad, 0u) << "window rows " << t.r0 << " cols " << t.c0 << ": scales differ";
        }
    }
}

TEST(dummy_values, refuses_bad_descriptors_by_name) {
    dummy_tensor_desc bad = dummy_desc(dummy_format::FP8_BLOCK, 384, 640, 128, 0.05, 1);
    bad.name = "layers.3.attn.wq_b.weight";
    bad.col0 = 64;  // off the 128-column block grid
    auto r = backend::cpu::dummy_bytes(bad);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(r.status().message().find("layers.3.attn.wq_b.weight"), std::string::npos) << r.status().message();
    bad.col0 = 0;
    bad.nrows = 512;  // beyond the tensor
    EXPECT_FALSE(backend::cpu::dummy_bytes(bad).is_ok());
    dummy_tensor_desc odd4 = dummy_desc(dummy_format::MXFP4, 40, 161, 32, 0.05, 2);
    EXPECT_FALSE(backend::cpu::dummy_bytes(odd4).is_ok());
    dummy_tensor_desc meaned = dummy_desc(dummy_format::FP8_BLOCK, 64, 64, 32, 0.05, 2);
    meaned.mean = 1;  // quantized values are zero-mean
    EXPECT_FALSE(backend::cpu::dummy_bytes(meaned).is_ok());
    dummy_tensor_desc ids = dummy_desc(dummy_format::I64, 10, 6, 1, 0, 3);
    ids.dist = dummy_dist::INDEX;  // index_range 0
    EXPECT_FALSE(backend::cpu::dummy_bytes(ids).is_ok());
    dummy_tensor_desc grid = dummy_desc(dummy_format::FP8_BLOCK, 64, 64, 8, 0.05, 2);
    EXPECT_FALSE(backend::cpu::dummy_bytes(grid).is_ok());  // block_in not a multiple of 16
}

TEST(dummy_values, plain_formats) {
    {  // an embedding-like BF16 N(0, 1)
        const dummy_tensor_desc d = dummy_desc(dummy_format::BF16, 1024, 1024, 1, 1.0, 20);
        const std::vector<float> v = testing_util::dummy_dequant(d, host_fill(d, 1));
        const testing_util::moments m = testing_util::stats(v);
        EXPECT_EQ(m.non_finite, 0u);
        EXPECT_LT(std::fabs(m.mean), 0.01);
        EXPECT_NEAR(m.std, 1.0, 0.01);
        float amax = 0;
        for (float x : v) amax = std::max(amax, std::fabs(x));
        EXPECT_LE(amax, 3.47f);  // four uniforms: bounded at 2 sqrt 3
        EXPECT_GT(amax, 2.5f);
    }
    {  // F32 uniform with a mean
        dummy_tensor_desc d = dummy_desc(dummy_format::F32, 500, 1000, 1, 0.25, 21);
        d.dist = dummy_dist::UNIFORM;
        d.mean = 2;
        const std::vector<float> v = testing_util::dummy_dequant(d, host_fill(d, 1));
        const testing_util::moments m = testing_util::stats(v);
        EXPECT_EQ(m.non_finite, 0u);
        EXPECT_NEAR(m.mean, 2.0, 0.003);
        EXPECT_NEAR(m.std, 0.25, 0.0025);
        for (float x : v) ASSERT_TRUE(x >= 2 - 0.25f * 1.7321f && x <= 2 + 0.25f * 1.7321f) << x;
    }
    for (dummy_format fmt : {dummy_format::BF16, dummy_format::F32}) {  // norm gains: 1.0
        dummy_tensor_desc d = dummy_desc(fmt, 1, 5120, 1, 0, 22);
        d.dist = dummy_dist::CONSTANT;
        d.mean = 1.0;
        for (float x : testing_util::dummy_dequant(d, host_fill(d, 1))) ASSERT_EQ(x, 1.0f);
    }
    {  // V4 tid2eid [129280, 6] over 256 experts: in range, distinct in a row, every expert used
        dummy_tensor_desc d = dummy_desc(dummy_format::I64, 129280, 6, 1, 0, 23);
        d.dist = dummy_dist::INDEX;
        d.index_range = 256;
        const dummy_bytes_host f = host_fill(d, 1);
        std::vector<int64_t> ids(f.w.size() / 8);
        std::memcpy(ids.data(), f.w.data(), f.w.size());
        std::vector<size_t> hits(256, 0);
        size_t bad = 0;
        for (size_t r = 0; r < 129280; r++)
            for (size_t j = 0; j < 6; j++) {
                const int64_t e = ids[r * 6 + j];
                if (e < 0 || e >= 256) {
                    bad++;
                    continue;
                }
                hits[size_t(e)]++;
                for (size_t k = 0; k < j; k++) bad += ids[r * 6 + k] == e;
            }
        EXPECT_EQ(bad, 0u);
        for (size_t h : hits) EXPECT_GT(h, 129280u * 6 / 256 / 2);
    }
}

}  // namespace
