// GPU compressor pooling (backend/cuda/compressor) against the pooling loop of engine
// v41_model.cpp compress() (a member of the engine, not callable alone; its loop is repeated
// here as written there). Shapes: V4.1 (ratio 2, head_dim 512) at decode (one group) and at a
// 16384-token prefill (8192 groups), the fixture (head_dim 64, 3 groups), and ratio 4.
// Metric: |d| <= 2^-20 * sum_t |kv_t| (a few ulp of the terms' scale; the softmax
// weights are <= 1): the fp32 steps are the host's, but exp is fp64-rounded on the GPU where
// the host calls glibc's expf (~6e-4 of arguments differ by an ulp). With bf16 output: within
// one bf16 ulp (2^-7 relative). Bit mismatches are printed; latent is poisoned with NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "backend/cuda/compressor.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

// v41_model.cpp compress(), the pooling of `groups` complete groups.
std::vector<float> host_pool(const std::vector<float> &buf_kv, const std::vector<float> &buf_gate, int64_t groups,
                             int ratio, int64_t hd) {
    std::vector<float> latent(size_t(groups * hd));
    for (int64_t g = 0; g < groups; g++)
        for (int64_t ch = 0; ch < hd; ch++) {
            float mx = -std::numeric_limits<float>::infinity();
            for (int t = 0; t < ratio; t++) mx = std::max(mx, buf_gate[size_t((g * ratio + t) * hd + ch)]);
            float den = 0, num = 0;
            for (int t = 0; t < ratio; t++) {
                float e = std::exp(buf_gate[size_t((g * ratio + t) * hd + ch)] - mx);
                den += e;
            }
            for (int t = 0; t < ratio; t++) {
                float e = std::exp(buf_gate[size_t((g * ratio + t) * hd + ch)] - mx) / den;
                num += buf_kv[size_t((g * ratio + t) * hd + ch)] * e;
            }
            latent[size_t(g * hd + ch)] = num;
        }
    return latent;
}

class CudaCompressor : public testing_util::CudaOps {
protected:
    void check(int64_t G, int ratio, int64_t hd, uint32_t seed, bool time = false) {
        const size_t n = size_t(G * ratio * hd);
        std::vector<float> kv = testing_util::random_normal(n, seed), gate = testing_util::random_normal(n, seed + 1);
        for (size_t i = 0; i < n; i++) gate[i] = (i % 13 == 0) ? 0.5f : 2.0f * gate[i];  // some equal gates
        const std::vector<float> ref = host_pool(kv, gate, G, ratio, hd);
        dev_vec<float> dkv(kv), dg(gate), dl(size_t(G * hd));
        for (bool rb : {false, true}) {
            dl.poison();
            ASSERT_TRUE(cuda::compress_pool(dkv.p, dg.p, G, ratio, hd, rb, dl.p, nullptr).is_ok());
            const std::vector<float> got = dl.download();
            int64_t bits = 0;
            double worst = 0;
            for (int64_t g = 0; g < G; g++)
                for (int64_t ch = 0; ch < hd; ch++) {
                    const size_t i = size_t(g * hd + ch);
                    ASSERT_TRUE(std::isfinite(got[i])) << "latent[" << g << ", " << ch << "] not written";
                    const float want = rb ? round_bf16(ref[i]) : ref[i];
                    double scale = 0;
                    for (int t = 0; t < ratio; t++) scale += std::fabs(kv[size_t((g * ratio + t) * hd + ch)]);
                    const double d = std::fabs(double(got[i]) - want);
                    const double tol = rb ? std::ldexp(std::fabs(double(want)), -7) + std::ldexp(scale, -20)
                                          : std::ldexp(scale, -20);
                    EXPECT_LE(d, tol) << "latent[" << g << ", " << ch << "] ratio " << ratio << (rb ? " bf16" : "");
                    bits += f32_bits(got[i]) != f32_bits(want);
                    worst = std::max(worst, d / std::max(scale, 1e-30));
                }
            std::printf("[ info ] compress_pool G %lld ratio %d hd %lld%s: %lld bit mismatches of %lld, max |d| / "
                        "sum|kv| %.3g\n",
                        (long long)G, ratio, (long long)hd, rb ? " bf16" : "", (long long)bits, (long long)(G * hd), worst);
        }
        if (time)
            testing_util::print_timing("compress_pool G " + std::to_string(G) + " ratio " + std::to_string(ratio) + " hd " +
                                           std::to_string(hd),
                                       double(n * 8 + size_t(G * hd) * 4),
                                       [&] { (void)cuda::compress_pool(dkv.p, dg.p, G, ratio, hd, false, dl.p, nullptr); });
    }
};

TEST_F(CudaCompressor, V41DecodeAndPrefill) {
    check(1, 2, 512, 1, true);
    check(8192, 2, 512, 2, true);
}

TEST_F(CudaCompressor, FixtureAndRatioFour) {
    check(3, 2, 64, 3);
    check(257, 4, 512, 4);
}

TEST_F(CudaCompressor, RejectsBadShapes) {
    EXPECT_FALSE(cuda::compress_pool(nullptr, nullptr, 1, 0, 512, false, nullptr, nullptr).is_ok());
    EXPECT_FALSE(cuda::compress_pool(nullptr, nullptr, 1, 2, 512, false, nullptr, nullptr).is_ok());
}

}  // namespace
