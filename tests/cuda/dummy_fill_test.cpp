// GPU dummy-weight fills (backend/cuda/dummy_fill) at real V4.1 / V4 shapes against the CPU
// reference fill_dummy_host (backend/cpu/dummy_values, itself checked in tests/unit): bit-exact
// bytes, codes and scales, for whole tensors and block-aligned windows. Device buffers are
// poisoned with 0xff first (NaN in every format), so an unwritten byte fails. The stored bytes are
// also dequantized on the host with core/dtype's decoders: no NaN / Inf, mean within 1% of the std
// of zero, std within 0.5% of dummy_encoding_for's expectation (EXL3: of the expectation for the
// svh magnitudes drawn, and 3% of the one over draws) and 3% of the target; EXL3 dequantizes through model/exl3's
// trellis decoder and Hadamard rotations, NVFP4 through core/dtype's E2M1 / E4M3. Determinism:
// a second fill gives the same bytes, another id other bytes. The fill rate of a 17 GB set is
// printed (information, never asserted).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "../unit/dummy_stats.h"
#include "backend/cuda/dummy_fill.cuh"
#include "core/dtype.h"
#include "model/exl3.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using cuda::dummy_dist;
using cuda::dummy_format;
using cuda::dummy_tensor_desc;
using testing_util::dev_vec;
using testing_util::dummy_bytes_host;
using testing_util::dummy_desc;

namespace {

class CudaDummyFill : public testing_util::CudaOps {};

dummy_bytes_host gpu_fill(const dummy_tensor_desc &d, uint64_t seed) {
    dummy_bytes_host f;
    auto b = cuda::dummy_bytes(d);
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    if (!b.is_ok()) return f;
    dev_vec<uint8_t> w(b.value().weight), s(std::max<uint64_t>(1, b.value().scale));
    w.poison();
    s.poison();
    Status st = cuda::fill_dummy(d, w.p, b.value().scale ? s.p : nullptr, seed, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    f.w = w.download();
    f.s = s.download();
    f.s.resize(b.value().scale);
    return f;
}

dummy_bytes_host host_fill(const dummy_tensor_desc &d, uint64_t seed) {
    dummy_bytes_host f;
    auto b = cpu::dummy_bytes(d);
    if (!b.is_ok()) return f;
    f.w.assign(b.value().weight, 0xff);
    f.s.assign(b.value().scale, 0xff);
    EXPECT_TRUE(cpu::fill_dummy_host(d, f.w.data(), f.s.data(), seed).is_ok());
    return f;
}

// Byte mismatches between the GPU and CPU fills, the first few reported.
size_t mismatches(const std::vector<uint8_t> &gpu, const std::vector<uint8_t> &cpu_ref, const char *what) {
    EXPECT_EQ(gpu.size(), cpu_ref.size()) << what;
    size_t bad = 0;
    for (size_t i = 0; i < std::min(gpu.size(), cpu_ref.size()); i++)
        if (gpu[i] != cpu_ref[i] && bad++ < 5)
            ADD_FAILURE() << what << ": byte " << i << " gpu 0x" << std::hex << int(gpu[i]) << " cpu 0x" << int(cpu_ref[i])
                          << std::dec;
    return bad;
}

void check_against_cpu(const dummy_tensor_desc &d, const char *what) {
    const dummy_bytes_host g = gpu_fill(d, 42), h = host_fill(d, 42);
    const size_t bw = mismatches(g.w, h.w, what), bs = mismatches(g.s, h.s, what);
    EXPECT_EQ(bw, 0u) << what << ": values";
    EXPECT_EQ(bs, 0u) << what << ": scales";
    // Moments only where the sample is large enough for the 0.5% bound (>= 1M values).
    const bool whole = d.row0 == 0 && d.col0 == 0 && d.nrows < 0 && d.ncols < 0 && d.rows * d.cols >= (1 << 20);
    if (!whole || d.format == dummy_format::I64) {
        std::printf("[ info ] %s: %zu value bytes, %zu scale bytes, mismatches %zu + %zu\n", what, g.w.size(), g.s.size(),
                    bw, bs);
        return;
    }
    auto enc = cuda::dummy_encoding_for(d);
    ASSERT_TRUE(enc.is_ok());
    const testing_util::moments m = testing_util::stats(testing_util::dummy_dequant(d, g));
    EXPECT_EQ(m.non_finite, 0u) << what;
    if (d.dist != dummy_dist::CONSTANT) {
        EXPECT_LT(std::fabs(m.mean - d.mean), 0.01 * d.std) << what;
        if (d.format == dummy_format::EXL3) {  // the expectation for the svh magnitudes drawn, and over draws
            const uint16_t *svh = reinterpret_cast<const uint16_t *>(g.s.data()) + d.cols;
            double sv2 = 0;
            for (int64_t j = 0; j < d.rows; j++) sv2 += double(f16_to_f32(svh[j])) * f16_to_f32(svh[j]) / double(d.rows);
            const double drawn = double(f16_to_f32(enc.value().suh_bits)) * std::sqrt(sv2) * d.exl3_code_rms;
            EXPECT_NEAR(m.std, drawn, 0.005 * drawn) << what;
            EXPECT_NEAR(m.std, enc.value().expected_std, 0.03 * enc.value().expected_std) << what;
        } else {
            EXPECT_NEAR(m.std, enc.value().expected_std, 0.005 * enc.value().expected_std) << what;
        }
        EXPECT_NEAR(m.std, d.std, 0.03 * d.std) << what;
    }
    EXPECT_TRUE(gpu_fill(d, 42).w == g.w) << what << ": same seed and id, other bytes";
    dummy_tensor_desc other = d;
    other.id = d.id + 1;
    const size_t same = testing_util::equal_bytes(gpu_fill(other, 42).w, g.w);
    if (d.dist != dummy_dist::CONSTANT) {
        EXPECT_LT(double(same), 0.2 * double(g.w.size())) << what << ": another id, same bytes";
    }
    std::printf("[ info ] %s [%lld, %lld]: mismatches vs CPU %zu + %zu; target std %.6g, expected %.6g, measured "
                "mean %.3g std %.6g (%+.3f%% vs target); equal bytes vs another id %.1f%%\n",
                what, (long long)d.rows, (long long)d.cols, bw, bs, d.std, enc.value().expected_std, m.mean, m.std,
                100 * (m.std / d.std - 1), 100.0 * double(same) / double(g.w.size()));
}

TEST_F(CudaDummyFill, Fp8BlocksV41WoB) {  // layers.N.attn.wo_b [5120, 8192], 32 x 32 blocks
    check_against_cpu(dummy_desc(dummy_format::FP8_BLOCK, 5120, 8192, 32, 1 / std::sqrt(8192.0), 7), "FP8 32x32 wo_b");
}

TEST_F(CudaDummyFill, Fp8BlocksV4WqBUniform) {  // V4 wq_b [32768, 1024], 128 x 128 blocks
    dummy_tensor_desc d = dummy_desc(dummy_format::FP8_BLOCK, 32768, 1024, 128, 1 / std::sqrt(1024.0), 8);
    d.dist = dummy_dist::UNIFORM;
    check_against_cpu(d, "FP8 128x128 wq_b uniform");
}

TEST_F(CudaDummyFill, EngramRows) {  // Engram table rows [rows, 256] (256K of the 384M), E8M0 per (row, 32)
    dummy_tensor_desc d = dummy_desc(dummy_format::FP8_BLOCK, 1 << 18, 256, 32, 1.0, 9);
    d.block_out = 1;
    check_against_cpu(d, "FP8 1x32 Engram rows");
}

TEST_F(CudaDummyFill, Mxfp4Experts) {  // V4.1 routed experts w1 [2304, 5120] and w2 [5120, 2304]
    check_against_cpu(dummy_desc(dummy_format::MXFP4, 2304, 5120, 32, 1 / std::sqrt(5120.0), 10), "MXFP4 w1");
    check_against_cpu(dummy_desc(dummy_format::MXFP4, 5120, 2304, 32, 1 / std::sqrt(2304.0), 11), "MXFP4 w2");
}

// The quantized publications' routed experts at V4.1 shapes (spec quant-formats 1.3, 3).
dummy_tensor_desc nvfp4_desc(int64_t out, int64_t in, uint64_t id) {
    dummy_tensor_desc d = dummy_desc(dummy_format::NVFP4, out, in, 16, 1 / std::sqrt(double(in)), id);
    d.block_out = 1;
    return d;
}

dummy_tensor_desc exl3_desc(int64_t out, int64_t in, uint64_t id) {
    dummy_tensor_desc d = dummy_desc(dummy_format::EXL3, out, in, 128, 1 / std::sqrt(double(in)), id);
    d.exl3_bits = 2;
    // RMS of the MCG codebook over all 2^16 states (model::exl3_codebook_rms; spec 2.4: std 1.2441).
    double ms = 0;
    for (uint32_t st = 0; st < 65536; st++) {
        const double v = f16_to_f32(model::exl3_codebook_value(uint16_t(st), model::exl3_codebook::MCG));
        ms += v * v;
    }
    d.exl3_code_rms = std::sqrt(ms / 65536);
    return d;
}

TEST_F(CudaDummyFill, Nvfp4Experts) {  // w1 U8 [2304, 2560] + E4M3 [2304, 320]; w2 [5120, 1152] + [5120, 144]
    check_against_cpu(nvfp4_desc(2304, 5120, 12), "NVFP4 w1");
    check_against_cpu(nvfp4_desc(5120, 2304, 13), "NVFP4 w2");
    auto enc = cuda::dummy_encoding_for(nvfp4_desc(2304, 5120, 12));
    ASSERT_TRUE(enc.is_ok());
    std::printf("[ info ] NVFP4 w1 scalars: weight_scale_2 %.6g, input_scale %.6g\n", enc.value().weight_scale_2,
                enc.value().input_scale);
}

TEST_F(CudaDummyFill, Exl3Experts) {  // trellis I16 [320, 144, 32] + suh [5120] + svh [2304]; w2 transposed
    check_against_cpu(exl3_desc(2304, 5120, 14), "EXL3 K2 w1");
    check_against_cpu(exl3_desc(5120, 2304, 15), "EXL3 K2 w2");
    dummy_tensor_desc k3 = exl3_desc(512, 768, 16);
    k3.exl3_bits = 3;  // 48 words a tile: the 16-byte chunks straddle no tile
    check_against_cpu(k3, "EXL3 K3 small");
}

TEST_F(CudaDummyFill, QuantizedExpertWindows) {  // TP slices: 128-channel EXL3 blocks, NVFP4 16-blocks
    struct win {
        dummy_tensor_desc d;
        int64_t r0, nr, c0, nc;
        const char *what;
    };
    const dummy_tensor_desc e1 = exl3_desc(2304, 5120, 17), e2 = exl3_desc(5120, 2304, 18);
    const dummy_tensor_desc n1 = nvfp4_desc(2304, 5120, 19);
    for (const win &t : {win{e1, 1152, 1152, 0, -1, "EXL3 w1 TP2 rank 1 (outputs 1152..)"},
                         win{e2, 0, -1, 1280, 512, "EXL3 w2 TP4 rank 2 (inputs 1280..1791)"},
                         win{n1, 576, 576, 0, -1, "NVFP4 w1 TP4 rank 1"}, win{n1, 8, 8, 48, 80, "NVFP4 odd window"}}) {
        dummy_tensor_desc w = t.d;
        w.row0 = t.r0;
        w.nrows = t.nr;
        w.col0 = t.c0;
        w.ncols = t.nc;
        check_against_cpu(w, t.what);
    }
}

TEST_F(CudaDummyFill, PlainFormats) {
    check_against_cpu(dummy_desc(dummy_format::BF16, 8192, 5120, 1, 1.0, 20), "BF16 embed rows");
    dummy_tensor_desc u = dummy_desc(dummy_format::F32, 1000, 1000, 1, 0.25, 21);
    u.dist = dummy_dist::UNIFORM;
    u.mean = 2;
    check_against_cpu(u, "F32 uniform");
    dummy_tensor_desc one = dummy_desc(dummy_format::BF16, 1, 5120, 1, 0, 22);
    one.dist = dummy_dist::CONSTANT;
    one.mean = 1;
    check_against_cpu(one, "BF16 norm gain 1");
    dummy_tensor_desc ids = dummy_desc(dummy_format::I64, 129280, 6, 1, 0, 23);
    ids.dist = dummy_dist::INDEX;
    ids.index_range = 256;
    check_against_cpu(ids, "I64 tid2eid");
    ids.row0 = 1000;  // a window of rows
    ids.nrows = 24;
    check_against_cpu(ids, "I64 tid2eid rows 1000..1023");
}

TEST_F(CudaDummyFill, WindowsAndRowTails) {
    struct win {
        dummy_tensor_desc d;
        int64_t r0, nr, c0, nc;
        const char *what;
    };
    const dummy_tensor_desc fp8 = dummy_desc(dummy_format::FP8_BLOCK, 384, 640, 128, 0.05, 1);
    const dummy_tensor_desc fp4 = dummy_desc(dummy_format::MXFP4, 40, 160, 32, 0.05, 2);
    const dummy_tensor_desc odd = dummy_desc(dummy_format::FP8_BLOCK, 100, 90, 32, 0.05, 4);   // partial blocks, tails
    const dummy_tensor_desc odd4 = dummy_desc(dummy_format::MXFP4, 7, 100, 32, 0.05, 5);       // 50-byte rows
    const dummy_tensor_desc bf = dummy_desc(dummy_format::BF16, 33, 70, 1, 0.5, 3);
    for (const win &t : {win{fp8, 128, 256, 128, 384, "FP8 window"}, win{fp8, 0, -1, 0, -1, "FP8 whole small"},
                         win{fp4, 5, 4, 64, 64, "MXFP4 window"}, win{fp4, 39, 1, 128, -1, "MXFP4 last block"},
                         win{odd, 0, -1, 0, -1, "FP8 90 columns"}, win{odd, 64, -1, 64, -1, "FP8 tail window"},
                         win{odd4, 0, -1, 0, -1, "MXFP4 100 columns"}, win{bf, 3, 7, 11, 13, "BF16 window"}}) {
        dummy_tensor_desc w = t.d;
        w.row0 = t.r0;
        w.nrows = t.nr;
        w.col0 = t.c0;
        w.ncols = t.nc;
        check_against_cpu(w, t.what);
    }
}

// A 17 GB set (an FP8 projection stack, MXFP4, NVFP4 and EXL3 experts, a BF16 table) filled and
// timed; printed, never asserted. Skipped when the device cannot hold it.
TEST_F(CudaDummyFill, FillRate) {
    struct item {
        dummy_tensor_desc d;
        const char *what;
    };
    const std::vector<item> items = {
        {dummy_desc(dummy_format::FP8_BLOCK, 1 << 20, 6144, 32, 0.01, 30), "FP8 32x32 [1M, 6144]"},
        {dummy_desc(dummy_format::MXFP4, 1 << 20, 10240, 32, 0.01, 31), "MXFP4 [1M, 10240]"},
        {dummy_desc(dummy_format::BF16, 129280, 5120, 1, 1.0, 32), "BF16 [129280, 5120]"},
        {nvfp4_desc(1 << 20, 5120, 33), "NVFP4 [1M, 5120]"},
        {exl3_desc(1 << 20, 5120, 34), "EXL3 K2 [out 1M, in 5120]"},
    };
    double total = 0, total_ms = 0;
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
