// GPU dummy-weight fills (backend/cuda/dummy_fill) at real V4.1 / V4 shapes: the stored bytes
// dequantized on the host with core/dtype (e4m3_to_f32, e2m1_to_f32, e8m0_to_f32, bf16_to_f32),
// independent of the kernels. Checked: no NaN code or scale anywhere (buffers are poisoned with
// 0xff first, a NaN in every format, so an unwritten byte fails too); the dequantized mean within
// 1% of the std of zero and the std within 0.5% of dummy_encoding_for's expected value and 3% of
// the target; same (seed, id) gives the same bytes, another id or seed other bytes; a window is the
// same range of the whole tensor; bad windows are refused by name. The fill rate is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "backend/cuda/dummy_fill.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using cuda::dummy_dist;
using cuda::dummy_format;
using cuda::dummy_tensor_desc;
using testing_util::dev_vec;

namespace {

class CudaDummyFill : public testing_util::CudaOps {};

struct filled {
    std::vector<uint8_t> w, s;
};

filled fill(const dummy_tensor_desc &d, uint64_t seed) {
    auto b = cuda::dummy_bytes(d);
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    dev_vec<uint8_t> w(b.value().weight), s(std::max<uint64_t>(1, b.value().scale));
    w.poison();
    s.poison();
    Status st = cuda::fill_dummy(d, w.p, s.p, seed, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    filled f{w.download(), s.download()};
    f.s.resize(b.value().scale);
    return f;
}

struct moments {
    double mean = 0, std = 0;
    size_t non_finite = 0;
};

moments stats(const std::vector<float> &v) {
    moments m;
    double s = 0, ss = 0;
    size_t n = 0;
    for (float x : v) {
        if (!std::isfinite(x)) {
            m.non_finite++;
            continue;
        }
        s += x;
        ss += double(x) * x;
        n++;
    }
    m.mean = s / double(n);
    m.std = std::sqrt(std::max(0.0, ss / double(n) - m.mean * m.mean));
    return m;
}

// [rows, cols] dequantized: FP8 codes on a (bo x bi) scale grid, or MXFP4 (1 x 32).
std::vector<float> dequant(const dummy_tensor_desc &d, const filled &f, int64_t rows, int64_t cols) {
    std::vector<float> v(size_t(rows * cols));
    const bool fp4 = d.format == dummy_format::MXFP4;
    const int64_t bo = fp4 ? 1 : d.block_out, bi = fp4 ? 32 : d.block_in, sc = (cols + bi - 1) / bi;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const float code = fp4 ? e2m1_to_f32(e2m1_unpack(f.w.data() + r * cols / 2, size_t(c)))
                                   : e4m3_to_f32(f.w[size_t(r * cols + c)]);
            v[size_t(r * cols + c)] = code * e8m0_to_f32(f.s[size_t((r / bo) * sc + c / bi)]);
        }
    return v;
}

size_t equal_bytes(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b) {
    size_t n = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++) n += a[i] == b[i];
    return n;
}

// Fills d, checks codes, scales, moments, determinism and id / seed sensitivity.
void check_quantized(const dummy_tensor_desc &d, const char *what) {
    auto enc = cuda::dummy_encoding_for(d);
    ASSERT_TRUE(enc.is_ok()) << enc.status().to_string();
    const filled f = fill(d, 42);
    size_t nan_codes = 0, bad_scales = 0;
    if (d.format == dummy_format::FP8_BLOCK) {
        for (uint8_t b : f.w) nan_codes += (b & 0x7f) == 0x7f;
    }
    size_t jitter_count[3] = {0, 0, 0};
    for (uint8_t s : f.s) {
        const int j = int(s) - 127 - enc.value().scale_exp;
        if (j < 0 || j > (d.format == dummy_format::FP8_BLOCK ? 2 : 0)) bad_scales++;
        else jitter_count[j]++;
    }
    EXPECT_EQ(nan_codes, 0u) << what;
    EXPECT_EQ(bad_scales, 0u) << what;
    if (d.format == dummy_format::FP8_BLOCK) {
        for (size_t c : jitter_count) EXPECT_GT(double(c), 0.25 * double(f.s.size())) << what << ": scale exponents uneven";
    }
    const moments m = stats(dequant(d, f, d.rows, d.cols));
    EXPECT_EQ(m.non_finite, 0u) << what;
    EXPECT_LT(std::fabs(m.mean), 0.01 * d.std) << what;
    EXPECT_NEAR(m.std, enc.value().expected_std, 0.005 * enc.value().expected_std) << what;
    EXPECT_NEAR(m.std, d.std, 0.03 * d.std) << what;

    const filled again = fill(d, 42);
    EXPECT_TRUE(again.w == f.w && again.s == f.s) << what << ": same seed and id, other bytes";
    dummy_tensor_desc other = d;
    other.id = d.id + 1;
    const filled g = fill(other, 42), h = fill(d, 43);
    EXPECT_LT(double(equal_bytes(g.w, f.w)), 0.2 * double(f.w.size())) << what << ": another id, same codes";
    EXPECT_LT(double(equal_bytes(h.w, f.w)), 0.2 * double(f.w.size())) << what << ": another seed, same codes";
    std::printf("[ info ] %s [%lld, %lld]: target std %.6g, expected %.6g, measured mean %.3g std %.6g (%.3f%% off "
                "target), scale 2^%d, code std %.2f, equal codes vs other id %.1f%%\n",
                what, (long long)d.rows, (long long)d.cols, d.std, enc.value().expected_std, m.mean, m.std,
                100 * (m.std / d.std - 1), enc.value().scale_exp, enc.value().code_std,
                100.0 * double(equal_bytes(g.w, f.w)) / double(f.w.size()));
}

dummy_tensor_desc quant(dummy_format f, int64_t rows, int64_t cols, int block, double std, uint64_t id) {
    dummy_tensor_desc d;
    d.name = "test";
    d.format = f;
    d.rows = rows;
    d.cols = cols;
    d.block_out = d.block_in = block;
    d.std = std;
    d.id = id;
    return d;
}

TEST_F(CudaDummyFill, Fp8BlocksV41WoB) {  // layers.N.attn.wo_b [5120, 8192], 32 x 32 blocks
    check_quantized(quant(dummy_format::FP8_BLOCK, 5120, 8192, 32, 1 / std::sqrt(8192.0), 7), "FP8 32x32 wo_b");
}

TEST_F(CudaDummyFill, Fp8BlocksV4WqB) {  // V4 wq_b [32768, 1024], 128 x 128 blocks, uniform values
    dummy_tensor_desc d = quant(dummy_format::FP8_BLOCK, 32768, 1024, 128, 1 / std::sqrt(1024.0), 8);
    d.dist = dummy_dist::UNIFORM;
    check_quantized(d, "FP8 128x128 wq_b uniform");
}

TEST_F(CudaDummyFill, EngramRowsUnitStd) {  // Engram table rows [rows, 256], E8M0 per (row, 32)
    dummy_tensor_desc d = quant(dummy_format::FP8_BLOCK, 1 << 16, 256, 32, 1.0, 9);
    d.block_out = 1;
    check_quantized(d, "FP8 1x32 Engram rows");
}

TEST_F(CudaDummyFill, Mxfp4ExpertW2) {  // V4.1 routed expert w2 [5120, 2304], four experts stacked
    check_quantized(quant(dummy_format::MXFP4, 4 * 5120, 2304, 32, 1 / std::sqrt(2304.0), 10), "MXFP4 w2");
}

TEST_F(CudaDummyFill, Mxfp4ExpertW1) {  // V4.1 routed expert w1 [2304, 5120]
    check_quantized(quant(dummy_format::MXFP4, 2304, 5120, 32, 1 / std::sqrt(5120.0), 11), "MXFP4 w1");
}

TEST_F(CudaDummyFill, WindowsEqualTheWholeTensor) {
    struct win {
        dummy_tensor_desc d;
        int64_t r0, nr, c0, nc;
    };
    dummy_tensor_desc fp8 = quant(dummy_format::FP8_BLOCK, 384, 640, 128, 0.05, 1);  // 3 x 5 blocks
    dummy_tensor_desc fp4 = quant(dummy_format::MXFP4, 40, 160, 32, 0.05, 2);
    dummy_tensor_desc bf = quant(dummy_format::BF16, 33, 70, 1, 0.5, 3);
    dummy_tensor_desc odd = quant(dummy_format::FP8_BLOCK, 100, 90, 32, 0.05, 4);  // partial last blocks
    for (const win &t : {win{fp8, 128, 256, 128, 384}, win{fp8, 256, -1, 0, 128}, win{fp4, 5, 4, 64, 64},
                         win{fp4, 39, 1, 128, -1}, win{bf, 3, 7, 11, 13}, win{odd, 64, -1, 64, -1}}) {
        const filled whole = fill(t.d, 5);
        dummy_tensor_desc w = t.d;
        w.row0 = t.r0;
        w.nrows = t.nr;
        w.col0 = t.c0;
        w.ncols = t.nc;
        const filled part = fill(w, 5);
        const int64_t nr = t.nr < 0 ? t.d.rows - t.r0 : t.nr, nc = t.nc < 0 ? t.d.cols - t.c0 : t.nc;
        const bool fp4w = t.d.format == dummy_format::MXFP4;
        const int64_t esz = t.d.format == dummy_format::BF16 ? 2 : 1;
        // Codes: row by row (FP4: two codes a byte, windows start on even columns).
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
    // Off the block grid, outside the tensor, odd FP4 width: refused with the tensor's name.
    dummy_tensor_desc bad = fp8;
    bad.name = "layers.3.attn.wq_b.weight";
    bad.col0 = 64;
    auto r = cuda::dummy_bytes(bad);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("layers.3.attn.wq_b.weight"), std::string::npos) << r.status().message();
    bad.col0 = 0;
    bad.nrows = 512;
    EXPECT_FALSE(cuda::dummy_bytes(bad).is_ok());
    dummy_tensor_desc odd4 = fp4;
    odd4.cols = 161;
    EXPECT_FALSE(cuda::dummy_bytes(odd4).is_ok());
    dummy_tensor_desc meaned = fp8;
    meaned.mean = 1;
    EXPECT_FALSE(cuda::fill_dummy(meaned, nullptr, nullptr, 0, nullptr).is_ok());
}

TEST_F(CudaDummyFill, PlainFormats) {
    {  // embed [129280 -> 8192 rows, 5120] BF16 N(0, 1)
        dummy_tensor_desc d = quant(dummy_format::BF16, 8192, 5120, 1, 1.0, 20);
        const filled f = fill(d, 1);
        std::vector<float> v(f.w.size() / 2);
        for (size_t i = 0; i < v.size(); i++) v[i] = bf16_to_f32(uint16_t(f.w[2 * i] | f.w[2 * i + 1] << 8));
        const moments m = stats(v);
        EXPECT_EQ(m.non_finite, 0u);
        EXPECT_LT(std::fabs(m.mean), 0.01);
        EXPECT_NEAR(m.std, 1.0, 0.01);
        float amax = 0;
        for (float x : v) amax = std::max(amax, std::fabs(x));
        EXPECT_LE(amax, 3.47f);  // four uniforms: bounded at 2 sqrt 3
        std::printf("[ info ] BF16 normal [8192, 5120]: mean %.3g std %.6g amax %.3f\n", m.mean, m.std, amax);
    }
    {  // F32 uniform with a mean
        dummy_tensor_desc d = quant(dummy_format::F32, 1000, 1000, 1, 0.25, 21);
        d.dist = dummy_dist::UNIFORM;
        d.mean = 2;
        const filled f = fill(d, 1);
        std::vector<float> v(f.w.size() / 4);
        std::memcpy(v.data(), f.w.data(), f.w.size());
        const moments m = stats(v);
        EXPECT_EQ(m.non_finite, 0u);
        EXPECT_NEAR(m.mean, 2.0, 0.003);
        EXPECT_NEAR(m.std, 0.25, 0.0025);
        for (float x : v) ASSERT_TRUE(x >= 2 - 0.25f * 1.7321f && x <= 2 + 0.25f * 1.7321f) << x;
    }
    for (dummy_format fmt : {dummy_format::BF16, dummy_format::F32}) {  // norm gains: 1.0
        dummy_tensor_desc d = quant(fmt, 1, 5120, 1, 0, 22);
        d.dist = dummy_dist::CONSTANT;
        d.mean = 1.0;
        const filled f = fill(d, 1);
        size_t bad = 0;
        for (size_t i = 0; i < 5120; i++)
            bad += fmt == dummy_format::BF16 ? (f.w[2 * i] != 0x80 || f.w[2 * i + 1] != 0x3f)
                                             : std::memcmp(f.w.data() + 4 * i, "\x00\x00\x80\x3f", 4) != 0;
        EXPECT_EQ(bad, 0u);
    }
    {  // V4 tid2eid [129280, 6] over 256 experts
        dummy_tensor_desc d = quant(dummy_format::I64, 129280, 6, 1, 0, 23);
        d.dist = dummy_dist::INDEX;
        d.index_range = 256;
        const filled f = fill(d, 1);
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
        for (size_t h : hits) EXPECT_GT(h, 129280u * 6 / 256 / 2);  // every expert used, roughly evenly
    }
}

TEST(DummyEncoding, ExpectedStdFollowsTheTarget) {  // host only: the encoding choice
    for (dummy_format f : {dummy_format::FP8_BLOCK, dummy_format::MXFP4})
        for (double target : {1e-4, 1 / std::sqrt(5120.0), 0.3, 1.0, 40.0}) {
            dummy_tensor_desc d = quant(f, 64, 64, 32, target, 1);
            auto e = cuda::dummy_encoding_for(d);
            ASSERT_TRUE(e.is_ok()) << e.status().to_string();
            EXPECT_NEAR(e.value().expected_std, target, (f == dummy_format::MXFP4 ? 0.02 : 0.005) * target)
                << (f == dummy_format::MXFP4 ? "MXFP4" : "FP8") << " target " << target;
        }
    dummy_tensor_desc tiny = quant(dummy_format::FP8_BLOCK, 64, 64, 32, 1e-60, 1);
    EXPECT_FALSE(cuda::dummy_encoding_for(tiny).is_ok());
    dummy_tensor_desc c = quant(dummy_format::MXFP4, 64, 64, 32, 1, 1);
    c.dist = dummy_dist::CONSTANT;
    EXPECT_FALSE(cuda::dummy_encoding_for(c).is_ok());
}

// A 12 GB set (an FP8 projection stack, MXFP4 experts, a BF16 table) filled and timed; printed,
// never asserted. Skipped when the device cannot hold it.
TEST_F(CudaDummyFill, FillRate) {
    struct item {
        dummy_tensor_desc d;
        const char *what;
    };
    std::vector<item> items = {
        {quant(dummy_format::FP8_BLOCK, 1 << 20, 6144, 32, 0.01, 30), "FP8 32x32 [1M, 6144]"},
        {quant(dummy_format::MXFP4, 1 << 20, 10240, 32, 0.01, 31), "MXFP4 [1M, 10240]"},
        {quant(dummy_format::BF16, 129280, 5120, 1, 1.0, 32), "BF16 [129280, 5120]"},
    };
    double total = 0;
    float total_ms = 0;
    for (const item &it : items) {
        auto b = cuda::dummy_bytes(it.d);
        ASSERT_TRUE(b.is_ok());
        void *w = nullptr, *s = nullptr;
        if (cudaMalloc(&w, b.value().weight) != cudaSuccess ||
            cudaMalloc(&s, std::max<uint64_t>(1, b.value().scale)) != cudaSuccess) {
            cudaFree(w);
            cudaGetLastError();
            GTEST_SKIP() << "not enough device memory for " << it.what;
        }
        ASSERT_TRUE(cuda::fill_dummy(it.d, w, s, 0, nullptr).is_ok());  // warm-up
        cudaEvent_t a, e;
        cudaEventCreate(&a);
        cudaEventCreate(&e);
        cudaEventRecord(a);
        ASSERT_TRUE(cuda::fill_dummy(it.d, w, s, 1, nullptr).is_ok());
        cudaEventRecord(e);
        ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, e);
        const double bytes = double(b.value().weight + b.value().scale);
        std::printf("[ time ] fill_dummy %s: %.2f GB in %.2f ms, %.0f GB/s\n", it.what, bytes / 1e9, ms,
                    bytes / (ms * 1e-3) / 1e9);
        total += bytes;
        total_ms += ms;
        cudaEventDestroy(a);
        cudaEventDestroy(e);
        cudaFree(w);
        cudaFree(s);
    }
    std::printf("[ time ] fill_dummy: %.2f GB in %.1f ms of kernels, %.0f GB/s\n", total / 1e9, total_ms,
                total / (total_ms * 1e-3) / 1e9);
}

}  // namespace
