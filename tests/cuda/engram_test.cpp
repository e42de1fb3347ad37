// GPU Engram gating (backend/cuda/engram) against the gating loop of engine v41_model.cpp
// engram() (a member of the engine, not callable alone: repeated here as written there, with
// backend/cpu's sigmoid and core's round_bf16). Shapes: V4.1 (4 streams of 5120, eps 1e-20) at
// decode (1 and 16 tokens) and a 256-token prefill, and the fixture (dim 256).
// Metric: |d| <= 2^-22 (|h| + |value|) (bf16 output: plus 2^-7 |ref|, one bf16 ulp): the fp32
// steps are the host's, but the three fp64 sums are taken in another order (their fp32
// roundings agree but in rare near-ties) and the sigmoid's exp is fp64-rounded where the host
// calls glibc's expf, so g may be an ulp apart and the update h + g v with it. Bit mismatches
// are printed. The GPU works in place; the whole X is compared, so an unwritten element (X is
// uploaded fresh and every element changes) shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backend/cpu/ops.h"
#include "backend/cuda/engram.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

void host_gate(std::vector<float> &X, const std::vector<float> &kv, const float *q, const float *kw,
               const cuda::engram_gate_params &p) {
    const int hc = p.hc;
    const int64_t D = p.D, out_w = int64_t(hc + 1) * D;
    const float eps = p.eps;
    for (int64_t s = 0; s < p.S; s++) {
        const float *key = kv.data() + s * out_w, *value = key + hc * D;
        for (int j = 0; j < hc; j++) {
            float *h = X.data() + (s * hc + j) * D;
            const float *kj = key + j * D;
            double hh = 0, kk = 0;
            for (int64_t d = 0; d < D; d++) {
                hh += double(h[d]) * h[d];
                kk += double(kj[d]) * kj[d];
            }
            float rstd = (1.0f / std::sqrt(float(hh / double(D)) + eps)) * (1.0f / std::sqrt(float(kk / double(D)) + eps));
            double acc = 0;
            for (int64_t d = 0; d < D; d++) acc += double(h[d]) * (q[j * D + d] * kw[j * D + d]) * kj[d];
            const float dot = float(acc) * rstd * (1.0f / std::sqrt(float(D)));
            float g = cpu::sigmoid(std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6f)), dot));
            for (int64_t d = 0; d < D; d++) h[d] = h[d] + g * value[d];
            if (p.round_bf16)
                for (int64_t d = 0; d < D; d++) h[d] = round_bf16(h[d]);
        }
    }
}

class CudaEngram : public testing_util::CudaOps {
protected:
    void check(int64_t S, int64_t D, uint32_t seed, bool time = false) {
        const int hc = 4;
        std::vector<float> X = testing_util::random_normal(size_t(S * hc * D), seed);
        std::vector<float> kv = testing_util::random_normal(size_t(S * (hc + 1) * D), seed + 1);
        std::vector<float> q = testing_util::random_normal(size_t(hc * D), seed + 2);
        std::vector<float> kw = testing_util::random_normal(size_t(hc * D), seed + 3);
        // Correlate some streams with their keys so the gates spread over (0, 1), not only ~0.5.
        for (int64_t s = 0; s < S; s++)
            for (int j = 0; j < hc; j++)
                if ((s + j) % 3 != 0)
                    for (int64_t d = 0; d < D; d++)
                        X[size_t((s * hc + j) * D + d)] += float((s + j) % 2 ? 1 : -1) *
                                                           kv[size_t(s * (hc + 1) * D + j * D + d)] *
                                                           q[size_t(j * D + d)] * kw[size_t(j * D + d)];
        cuda::engram_gate_params p;
        p.S = S;
        p.hc = hc;
        p.D = D;
        p.eps = 1e-20f;
        dev_vec<float> dX(X), dkv(kv), dq(q), dkw(kw);
        for (bool rb : {false, true}) {
            p.round_bf16 = rb;
            std::vector<float> ref = X;
            host_gate(ref, kv, q.data(), kw.data(), p);
            dX.upload(X);
            ASSERT_TRUE(cuda::engram_gate(dX.p, dkv.p, dq.p, dkw.p, p, nullptr).is_ok());
            const std::vector<float> got = dX.download();
            int64_t bits = 0;
            double worst = 0;
            for (int64_t s = 0; s < S; s++)
                for (int j = 0; j < hc; j++)
                    for (int64_t d = 0; d < D; d++) {
                        const size_t i = size_t((s * hc + j) * D + d);
                        const double scale = std::fabs(X[i]) + std::fabs(kv[size_t(s * (hc + 1) * D + hc * D + d)]);
                        const double diff = std::fabs(double(got[i]) - ref[i]);
                        const double tol = std::ldexp(scale, -22) + (rb ? std::ldexp(std::fabs(double(ref[i])), -7) : 0.0);
                        ASSERT_TRUE(std::isfinite(got[i])) << "X[" << s << ", " << j << ", " << d << "]";
                        EXPECT_LE(diff, tol) << "X[" << s << ", " << j << ", " << d << "]" << (rb ? " bf16" : "");
                        bits += f32_bits(got[i]) != f32_bits(ref[i]);
                        worst = std::max(worst, diff / scale);
                    }
            std::printf("[ info ] engram_gate S %lld hc %d D %lld%s: %lld bit mismatches of %lld, max |d| / (|h| + "
                        "|v|) %.3g\n",
                        (long long)S, hc, (long long)D, rb ? " bf16" : "", (long long)bits, (long long)(S * hc * D), worst);
        }
        if (time)
            testing_util::print_timing("engram_gate S " + std::to_string(S) + " hc 4 D " + std::to_string(D),
                                       double(4 * (S * (3 * hc + 1) + 2 * hc) * D),
                                       [&] { (void)cuda::engram_gate(dX.p, dkv.p, dq.p, dkw.p, p, nullptr); });
    }
};

TEST_F(CudaEngram, V41DecodeAndPrefill) {
    check(1, 5120, 1, true);
    check(16, 5120, 2, true);
    check(256, 5120, 3, true);
}

TEST_F(CudaEngram, FixtureDim) { check(7, 256, 4); }

TEST_F(CudaEngram, RejectsBadShapes) {
    cuda::engram_gate_params p;
    p.S = 1;
    p.hc = 0;
    p.D = 5120;
    EXPECT_FALSE(cuda::engram_gate(nullptr, nullptr, nullptr, nullptr, p, nullptr).is_ok());
}

}  // namespace
