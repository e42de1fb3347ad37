// GPU RMSNorm (backend/cuda/norm) against backend/cpu rms_norm / rms_norm_unweighted_bf16 at
// V4.1 shapes (hidden 5120, eps 1e-20; q_lora 1024 as a second width) and V4's (4096, eps 1e-6;
// per-head q norm over 512).
// Tolerance, rms_norm: every element within 1e-6 relative. Both sides take the same fp32 steps
// after the sum of squares; the sum is fp64 on both, in different orders, which moves the fp32
// mean only at a rounding tie (1 ulp, 1.2e-7 relative). Bit mismatches are printed (expect 0).
// With bf16 output a 1-ulp fp32 difference could move a value across a bf16 tie: one bf16 ulp,
// at most 2^-7 relative.
// rms_norm_unweighted_bf16: bit-exact (the GPU adds in the host's order).
// Outputs are poisoned with NaN; the in-place bf16 norm is checked on every element. Widths that are
// multiples of 4 up to 8192 take the float4 kernel, the others the scalar one (both tested).
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cpu/ops.h"
#include "backend/cuda/norm.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

class CudaNorm : public testing_util::CudaOps {
protected:
    void check(int64_t rows, int64_t dim, float eps, bool weighted, bool rb, bool in_place) {
        const std::string what = "rms_norm rows " + std::to_string(rows) + " dim " + std::to_string(dim) +
                                 (weighted ? " w" : "") + (rb ? " bf16" : "") + (in_place ? " in-place" : "");
        std::vector<float> x = testing_util::spread_rows(rows, dim, uint32_t(rows * 31 + dim));
        std::vector<float> w = testing_util::random_normal(size_t(dim), uint32_t(dim));
        for (auto &v : w) v = 1.0f + 0.1f * v;
        std::vector<float> ref(x.size());
        cpu::rms_norm(x.data(), weighted ? w.data() : nullptr, ref.data(), rows, dim, eps);
        if (rb)
            for (auto &v : ref) v = round_bf16(v);

        dev_vec<float> dx(x), dw(w), dy(x.size());
        dy.poison();
        float *out = in_place ? dx.p : dy.p;
        ASSERT_TRUE(cuda::rms_norm_rows(dx.p, weighted ? dw.p : nullptr, out, rows, dim, eps, rb, nullptr).is_ok());
        std::vector<float> got = in_place ? dx.download() : dy.download();
        double worst = 0;
        size_t bits = 0;
        const double tol = rb ? 1.0 / 128 : 1e-6;
        for (size_t i = 0; i < ref.size(); i++) {
            ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " not written";
            bits += f32_bits(got[i]) != f32_bits(ref[i]);
            const double rel = std::fabs(double(got[i]) - ref[i]) / std::max(std::fabs(double(ref[i])), 1e-38);
            worst = std::max(worst, rel);
        }
        EXPECT_LE(worst, tol) << what;
        std::printf("[ info ] %s: max rel err %.3g, bit mismatches %zu of %zu\n", what.c_str(), worst, bits, ref.size());
    }
};

TEST_F(CudaNorm, V41HiddenRows) {
    check(16, 5120, 1e-20f, true, false, false);
    {
        dev_vec<float> x(testing_util::random_normal(16 * 5120, 1)), w(testing_util::random_normal(5120, 2)), y(16 * 5120);
        testing_util::print_timing("rms_norm [16, 5120]", 16 * 5120 * 8.0, [&] {
            (void)cuda::rms_norm_rows(x.p, w.p, y.p, 16, 5120, 1e-20f, false, nullptr);
        });
    }
    check(3, 5120, 1e-20f, true, true, false);
    check(7, 1024, 1e-20f, true, false, true);
    check(5, 5120, 1e-20f, false, false, false);  // unweighted (per-head q norm of V4.1 in fp32 mode)
}

TEST_F(CudaNorm, V4HiddenRows) {
    check(16, 4096, 1e-6f, true, false, false);
    check(4 * 64, 512, 1e-6f, false, false, true);
}

// The scalar kernel: widths the float4 kernel does not take (not a multiple of 4, wider than
// 8192), and the decode-time single row the float4 kernel serves, timed.
TEST_F(CudaNorm, ScalarAndVectorPaths) {
    check(3, 1001, 1e-6f, true, false, false);
    check(2, 9216, 1e-6f, true, true, true);
    check(1, 8192, 1e-20f, true, false, true);
    dev_vec<float> x(testing_util::random_normal(5120, 3)), w(testing_util::random_normal(5120, 4));
    testing_util::print_timing("rms_norm [1, 5120] in place", 5120 * 12.0, [&] {
        (void)cuda::rms_norm_rows(x.p, w.p, x.p, 1, 5120, 1e-20f, true, nullptr);
    });
}

TEST_F(CudaNorm, UnweightedBf16PerHeadIsBitExact) {
    const int64_t rows = 5 * 64, dim = 512;  // V4: [S, H, head_dim]
    std::vector<float> x = testing_util::spread_rows(rows, dim, 77);
    for (auto &v : x) v = round_bf16(v);
    std::vector<float> ref = x;
    cpu::rms_norm_unweighted_bf16(ref.data(), rows, dim, 1e-6f);
    dev_vec<float> dx(x);
    ASSERT_TRUE(cuda::rms_norm_unweighted_bf16_rows(dx.p, rows, dim, 1e-6f, nullptr).is_ok());
    std::vector<float> got = dx.download();
    size_t unchanged = 0;
    for (size_t i = 0; i < x.size(); i++) unchanged += f32_bits(ref[i]) == f32_bits(x[i]);
    const size_t bad = testing_util::bit_mismatches(got, ref, "rms_norm_unweighted_bf16");
    EXPECT_EQ(bad, 0u);
    std::printf("[ info ] rms_norm_unweighted_bf16 [%lld, %lld]: mismatches %zu (elements equal to their input, which "
                "cannot show a skipped write: %zu)\n", (long long)rows, (long long)dim, bad, unchanged);
}

TEST_F(CudaNorm, RejectsBadShapes) {
    EXPECT_FALSE(cuda::rms_norm_rows(nullptr, nullptr, nullptr, 1, 0, 1e-6f, false, nullptr).is_ok());
    EXPECT_FALSE(cuda::rms_norm_unweighted_bf16_rows(nullptr, 1, 9000, 1e-6f, nullptr).is_ok());
}

}  // namespace
