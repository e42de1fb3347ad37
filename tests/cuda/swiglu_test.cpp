// GPU clamped SwiGLU (backend/cuda/swiglu) against backend/cpu swiglu_expert itself, at V4.1's
// expert width (moe_inter 2304, limit 10) and V4's (2048): the CPU expert runs with selector
// weights (x = [g | u], w1 = [I | 0], w3 = [0 | I], w2 = [I ; 0]) in reference numerics, whose
// fp64 matmuls pass g, u and h through exactly, so its y[:, :I] is the activation it computes.
// Tolerance: |d| <= 1e-6 |ref|: both sides take the same fp32 steps except exp, which the GPU
// evaluates in fp64 and rounds once and glibc's expf gets within ~0.5 ulp (<= 1 ulp apart, a few
// ulp after the division and products). With bf16 output: within one bf16 ulp (<= 2^-7 relative).
// Bit mismatches are printed. The output array is poisoned with NaN.
// With a GEMV split (the shared expert's w2 input): h bit-identical to the launch without it, and
// the same official GEMV run on the split gives the bits it gives splitting h itself (tolerance:
// none), at V4.1's width (act_block 32) and V4's (128), 1, 5 and 16 rows, both roundings; split
// buffers start poisoned.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cpu/swiglu.h"
#include "backend/cuda/swiglu.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

class CudaSwiglu : public testing_util::CudaOps {
protected:
    void check(int64_t rows, int64_t I, float limit, bool weighted, bool rb) {
        const std::string what = "swiglu rows " + std::to_string(rows) + " inter " + std::to_string(I) + " limit " +
                                 std::to_string(int(limit)) + (weighted ? " weighted" : "") + (rb ? " bf16" : "");
        const int64_t D = 2 * I;
        std::vector<float> g = testing_util::random_normal(size_t(rows * I), uint32_t(I + 1));
        std::vector<float> u = testing_util::random_normal(size_t(rows * I), uint32_t(I + 2));
        for (auto &v : g) v *= 6.0f;  // crosses the clamp at 10 and reaches exp's far ends
        for (auto &v : u) v *= 6.0f;
        const float edges[] = {10.0f, -10.0f, 0.0f, -0.0f, -100.0f, -88.0f, 87.0f, 1e-30f};
        for (size_t i = 0; i < std::size(edges); i++) g[i] = u[i + 8] = edges[i];
        std::vector<float> w = testing_util::random_normal(size_t(rows), 9);
        for (auto &v : w) v = std::fabs(v) * 0.3f;

        Tensor w1 = Tensor::f32({I, D}), w3 = Tensor::f32({I, D}), w2 = Tensor::f32({D, I});
        std::fill(w1.f(), w1.f() + I * D, 0.0f);
        std::fill(w3.f(), w3.f() + I * D, 0.0f);
        std::fill(w2.f(), w2.f() + D * I, 0.0f);
        for (int64_t i = 0; i < I; i++) {
            w1.f()[i * D + i] = 1.0f;
            w3.f()[i * D + I + i] = 1.0f;
            w2.f()[i * I + i] = 1.0f;
        }
        std::vector<float> x(size_t(rows * D)), y(size_t(rows * D));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < I; i++) {
                x[size_t(r * D + i)] = g[size_t(r * I + i)];
                x[size_t(r * D + I + i)] = u[size_t(r * I + i)];
            }
        cpu::expert_numerics nm;
        nm.official = false;
        nm.swiglu_limit = limit;
        cpu::swiglu_expert(nm, w1, w2, w3, x.data(), rows, D, weighted ? w.data() : nullptr, y.data());

        dev_vec<float> dg(g), du(u), dw(w), dh(g.size());
        dh.poison();
        ASSERT_TRUE(cuda::swiglu_rows(dg.p, du.p, weighted ? dw.p : nullptr, dh.p, rows, I, limit, rb, nullptr).is_ok());
        std::vector<float> got = dh.download();
        double worst = 0;
        size_t bits = 0;
        const double tol = rb ? 1.0 / 128 : 1e-6;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < I; i++) {
                const float h = got[size_t(r * I + i)];
                const float ref = rb ? round_bf16(y[size_t(r * D + i)]) : y[size_t(r * D + i)];
                ASSERT_FALSE(std::isnan(h)) << what << ": element " << r * I + i << " not written";
                const double d = std::fabs(double(h) - ref);
                bits += d != 0;
                if (d > tol * std::fabs(double(ref))) ADD_FAILURE() << what << ": row " << r << " i " << i << " " << h << " vs " << ref;
                if (ref != 0) worst = std::max(worst, d / std::fabs(double(ref)));
            }
        std::printf("[ info ] %s: max rel err %.3g, value mismatches %zu of %lld\n", what.c_str(), worst, bits,
                    (long long)(rows * I));
    }
};

TEST_F(CudaSwiglu, V41RoutedRowsWithRouteWeight) {
    check(16, 2304, 10.0f, true, false);
    check(6, 2304, 10.0f, true, true);
    dev_vec<float> g(testing_util::random_normal(96 * 2304, 1)), u(testing_util::random_normal(96 * 2304, 2)),
        w(testing_util::random_normal(96, 3)), h(96 * 2304);
    testing_util::print_timing("swiglu_rows [96 routes, 2304]", 96 * 2304 * 12.0, [&] {
        (void)cuda::swiglu_rows(g.p, u.p, w.p, h.p, 96, 2304, 10.0f, false, nullptr);
    });
}

TEST_F(CudaSwiglu, SharedExpertAndV4Width) {
    check(8, 2304, 10.0f, false, false);
    check(8, 2048, 10.0f, true, false);
    check(4, 2048, 0.0f, false, false);  // no clamp
}

TEST_F(CudaSwiglu, SplitForTheNextGemvIsBitIdentical) {
    auto dev = cuda::query_device();
    ASSERT_TRUE(dev.is_ok());
    for (auto [I, act_block] : {std::pair{2304, 32}, std::pair{2048, 128}}) {
        const testing_util::quant_weight q = testing_util::random_fp8_block(320, I, act_block, act_block, uint32_t(I));
        for (bool rb : {false, true})
            for (int S : {1, 5, 16}) {
                const std::string what = "I " + std::to_string(I) + " act_block " + std::to_string(act_block) + " S " +
                                         std::to_string(S) + (rb ? " bf16" : "");
                std::vector<float> g = testing_util::random_normal(size_t(S) * I, uint32_t(S + I));
                std::vector<float> u = testing_util::random_normal(size_t(S) * I, uint32_t(S + I + 1));
                for (auto &v : g) v *= 6.0f;
                dev_vec<float> dg(g), du(u), ref(g.size()), got(g.size());
                dev_vec<uint8_t> xs(size_t(S) * I);
                dev_vec<float> sx(size_t(I / 32) * 16);
                ref.poison(), got.poison(), xs.poison(), sx.poison();
                ASSERT_TRUE(cuda::swiglu_rows(dg.p, du.p, nullptr, ref.p, S, I, 10.0f, rb, nullptr).is_ok());
                const cuda::gemv_split split{xs.p, sx.p};
                const Status st = cuda::swiglu_rows(dg.p, du.p, nullptr, got.p, S, I, 10.0f, rb, nullptr, &split, act_block);
                ASSERT_TRUE(st.is_ok()) << st.to_string();
                EXPECT_EQ(testing_util::bit_mismatches(got.download(), ref.download(), what + ": h"), 0u);
                const std::vector<float> own = testing_util::official_gemv(*dev, q, ref.p, S, 320, I, act_block, nullptr);
                const std::vector<float> given = testing_util::official_gemv(*dev, q, ref.p, S, 320, I, act_block, &split);
                EXPECT_EQ(testing_util::bit_mismatches(given, own, what + ": GEMV on the split"), 0u);
            }
    }
    dev_vec<float> g(32), u(32), h(32);
    dev_vec<uint8_t> xs(32 * 17);
    dev_vec<float> sx(16);
    const cuda::gemv_split split{xs.p, sx.p};
    EXPECT_FALSE(cuda::swiglu_rows(g.p, u.p, nullptr, h.p, 17, 32, 10.0f, false, nullptr, &split, 32).is_ok());  // 16 rows
    EXPECT_FALSE(cuda::swiglu_rows(g.p, u.p, nullptr, h.p, 1, 32, 10.0f, false, nullptr, &split, 64).is_ok());   // act_block
    EXPECT_FALSE(cuda::swiglu_rows(g.p, u.p, nullptr, h.p, 1, 32, 10.0f, false, nullptr, &split, 128).is_ok());  // divides I
}

TEST_F(CudaSwiglu, RejectsNegativeLimit) {
    EXPECT_FALSE(cuda::swiglu_rows(nullptr, nullptr, nullptr, nullptr, 1, 16, -1.0f, false, nullptr).is_ok());
}

}  // namespace
