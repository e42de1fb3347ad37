// GPU block fake quantizers and the Hadamard rotation (backend/cuda/fake_quant) against
// backend/cpu at V4.1 / V4 shapes. These are rounding functions: bit-exact, mismatches 0.
// Inputs: rows spread over 2^-20 .. 2^10 plus edge rows (exact rounding ties, subnormals,
// signed zeros, all-zero and tiny blocks: testing_util::quant_rows). The ops work in place, so
// every element is compared; the count of elements whose reference equals their input (where a
// skipped write would go unseen) is printed. Channels a _cols quantizer must not touch are
// checked to keep their input bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "backend/cpu/ops.h"
#include "backend/cuda/fake_quant.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

class CudaFakeQuant : public testing_util::CudaOps {
protected:
    void check(const std::string &what, int64_t rows, int64_t dim, const std::function<void(float *)> &cpu_op,
               const std::function<Status(float *)> &gpu_op, bool bf16_input = false) {
        std::vector<float> x = testing_util::quant_rows(rows, dim, uint32_t(rows * 131 + dim));
        if (bf16_input)
            for (auto &v : x) v = round_bf16(v);
        std::vector<float> ref = x;
        cpu_op(ref.data());
        dev_vec<float> dx(x);
        const Status st = gpu_op(dx.p);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        std::vector<float> got = dx.download();
        size_t same = 0;
        for (size_t i = 0; i < x.size(); i++) same += f32_bits(ref[i]) == f32_bits(x[i]);
        const size_t bad = testing_util::bit_mismatches(got, ref, what);
        EXPECT_EQ(bad, 0u) << what;
        std::printf("[ info ] %s [%lld, %lld]: mismatches %zu of %zu (reference equal to input: %zu)\n", what.c_str(),
                    (long long)rows, (long long)dim, bad, x.size(), same);
    }
};

TEST_F(CudaFakeQuant, Fp8Ue8m0WindowKvAndActivations) {
    // V4.1 window KV: [S, 512] per 32 (spec V4.1 7); act_quant of V4.1 (hidden 5120, per 32) and V4 (4096, per 128).
    for (auto [rows, dim, block] : {std::tuple{33, 512, 32}, std::tuple{16, 5120, 32}, std::tuple{16, 4096, 128}})
        check("fake_quant_fp8_ue8m0 block " + std::to_string(block), rows, dim,
              [&](float *p) { cpu::fake_quant_fp8_ue8m0(p, rows, dim, block); },
              [&](float *p) { return cuda::fake_quant_fp8_ue8m0(p, rows, dim, block, nullptr); });
    dev_vec<float> x(testing_util::random_normal(16 * 5120, 3));
    testing_util::print_timing("fake_quant_fp8_ue8m0 [16, 5120] / 32", 16 * 5120 * 8.0, [&] {
        (void)cuda::fake_quant_fp8_ue8m0(x.p, 16, 5120, 32, nullptr);
    });
}

TEST_F(CudaFakeQuant, Fp8Ue8m0ColsLeavesRopeDims) {
    // V4 window KV / compressed entries: the 448 nope dims of 512, per 64; the rope tail untouched.
    const int64_t rows = 40, stride = 512, cols = 448, block = 64;
    check("fake_quant_fp8_ue8m0_cols 448/512 block 64", rows, stride,
          [&](float *p) { cpu::fake_quant_fp8_ue8m0_cols(p, rows, stride, cols, block); },
          [&](float *p) { return cuda::fake_quant_fp8_ue8m0_cols(p, rows, stride, cols, block, nullptr); });
}

TEST_F(CudaFakeQuant, Fp4Ue8m0IndexerRows) {
    // V4.1 indexer q [S, 32 heads, 128] and keys [n, 128], per 32.
    const int64_t rows = 5 * 32 + 64, dim = 128;
    check("fake_quant_fp4_ue8m0 block 32", rows, dim, [&](float *p) { cpu::fake_quant_fp4_ue8m0(p, rows, dim, 32); },
          [&](float *p) { return cuda::fake_quant_fp4_ue8m0(p, rows, dim, 32, nullptr); });
}

TEST_F(CudaFakeQuant, Fp4E4m3CompressedEntries) {
    // V4.1 compressed KV entries: [n, 512], E4M3 scale per 16.
    const int64_t rows = 48, dim = 512;
    check("fake_quant_fp4_e4m3 block 16", rows, dim, [&](float *p) { cpu::fake_quant_fp4_e4m3(p, rows, dim, 16); },
          [&](float *p) { return cuda::fake_quant_fp4_e4m3(p, rows, dim, 16, nullptr); });
}

TEST_F(CudaFakeQuant, HadamardRotationBf16) {
    // V4 indexer: [S, 64 heads, 128]; x -> bf16(128^-0.5 H x).
    const int64_t rows = 5 * 64, dim = 128;
    check("hadamard_rotate_bf16", rows, dim,
          [&](float *p) {
              cpu::hadamard_transform(p, rows, dim, 1.0f / std::sqrt(float(dim)));
              for (int64_t i = 0; i < rows * dim; i++) p[i] = round_bf16(p[i]);
          },
          [&](float *p) { return cuda::hadamard_rotate_bf16(p, rows, dim, nullptr); }, true);
}

TEST_F(CudaFakeQuant, RotateFp4Ue8m0V4IndexerRows) {
    const int64_t rows = 5 * 64 + 64, dim = 128;
    check("rotate_fake_quant_fp4_ue8m0", rows, dim, [&](float *p) { cpu::rotate_fake_quant_fp4_ue8m0(p, rows, dim, 32); },
          [&](float *p) { return cuda::rotate_fake_quant_fp4_ue8m0(p, rows, dim, 32, nullptr); }, true);
}

TEST_F(CudaFakeQuant, RejectsBadBlocks) {
    dev_vec<float> x(size_t(512));
    EXPECT_FALSE(cuda::fake_quant_fp8_ue8m0(x.p, 1, 512, 24, nullptr).is_ok());    // not a power of two
    EXPECT_FALSE(cuda::fake_quant_fp8_ue8m0(x.p, 1, 512, 256, nullptr).is_ok());   // wider than a warp's lanes
    EXPECT_FALSE(cuda::fake_quant_fp8_ue8m0_cols(x.p, 1, 448, 512, 64, nullptr).is_ok());  // cols > stride
    EXPECT_FALSE(cuda::hadamard_rotate_bf16(x.p, 1, 96, nullptr).is_ok());
}

}  // namespace
