// GPU routing (backend/cuda/router) against the host's routing loop of engine v41_model.cpp
// moe() (a member of the engine, not callable alone: its loop is repeated here, calling the
// engine's own top_indices, linked into this binary). Shapes: V4.1 (E 384, top 6, route_scale
// 1.5, gate_temp 1, normalized) at decode (16 tokens) and prefill (4096), the fixture config (E 8,
// top 2), top 1 (no normalization) and gate_temp 2. Logits ~ N(0, 3^2) with every 17th scaled
// into softplus's linear range (> 20).
// Metric: the expert ids of every token equal in order (ties cannot happen at these values);
// weights within 4 ulp of the host's: exp and log1p are fp64-rounded on the GPU and glibc's
// expf / log1pf on the host (log1pf differs from the correctly rounded value in ~1% of
// arguments, an ulp in the score, a few after the normalization). Bit mismatches are printed.
// ids and weights are poisoned (0xff bytes: -1 / NaN) before the run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backend/cuda/router.cuh"
#include "engine/topk.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

// The host's routing of one token (v41_model.cpp moe()).
void host_route(const float *logits, const float *bias, const cuda::router_params &p, std::vector<int32_t> &ids,
                std::vector<float> &w) {
    const int64_t E = p.n_experts;
    std::vector<float> score(E), biased(E);
    for (int64_t e = 0; e < E; e++) {
        float v = logits[e] / p.gate_temp;
        float sp = v > 20.0f ? v : std::log1p(std::exp(v));
        score[size_t(e)] = std::sqrt(sp);
        biased[size_t(e)] = score[size_t(e)] + bias[e];
    }
    std::vector<int64_t> sel = engine::top_indices(biased.data(), E, p.k);
    float sum = 0;
    for (int64_t e : sel) sum += score[size_t(e)];
    ids.clear();
    w.clear();
    for (int64_t e : sel) {
        float wgt = score[size_t(e)];
        if (p.norm_topk_prob && p.k > 1) wgt = wgt / (sum + 1e-20f);
        ids.push_back(int32_t(e));
        w.push_back(wgt * p.route_scale);
    }
}

class CudaRouter : public testing_util::CudaOps {
protected:
    void check(int64_t S, cuda::router_params p, uint32_t seed, bool time = false) {
        const int E = p.n_experts;
        std::vector<float> logits = testing_util::random_normal(size_t(S * E), seed);
        for (size_t i = 0; i < logits.size(); i++) logits[i] *= (i % 17 == 0) ? 12.0f : 3.0f;
        std::vector<float> bias = testing_util::random_normal(size_t(E), seed + 1);
        for (auto &b : bias) b *= 0.1f;
        dev_vec<float> dl(logits), db(bias), dw(size_t(S * p.k));
        dev_vec<int32_t> di(size_t(S * p.k));
        di.poison();
        dw.poison();
        ASSERT_TRUE(cuda::route_topk(dl.p, db.p, S, p, di.p, dw.p, nullptr).is_ok());
        const std::vector<int32_t> gi = di.download();
        const std::vector<float> gw = dw.download();
        int64_t bad_ids = 0, bits = 0, worst_ulp = 0;
        std::vector<int32_t> ri;
        std::vector<float> rw;
        for (int64_t s = 0; s < S; s++) {
            host_route(logits.data() + s * E, bias.data(), p, ri, rw);
            ASSERT_EQ(ri.size(), size_t(p.k));
            for (int r = 0; r < p.k; r++) {
                const size_t i = size_t(s * p.k + r);
                if (gi[i] != ri[size_t(r)]) {
                    if (bad_ids++ < 3) ADD_FAILURE() << "token " << s << " pick " << r << ": " << gi[i] << " vs " << ri[size_t(r)];
                    continue;
                }
                ASSERT_TRUE(std::isfinite(gw[i])) << "weight " << s << ", " << r << " not written";
                bits += f32_bits(gw[i]) != f32_bits(rw[size_t(r)]);
                const int64_t u = testing_util::ulp_distance(gw[i], rw[size_t(r)]);
                worst_ulp = std::max(worst_ulp, u);
                EXPECT_LE(u, 4) << "weight " << s << ", " << r << ": " << gw[i] << " vs " << rw[size_t(r)];
            }
        }
        EXPECT_EQ(bad_ids, 0);
        std::printf("[ info ] route_topk S %lld E %d k %d: %lld id mismatches, weights: %lld bit mismatches of %lld, "
                    "max %lld ulp\n",
                    (long long)S, E, p.k, (long long)bad_ids, (long long)bits, (long long)(S * p.k), (long long)worst_ulp);
        if (time)
            testing_util::print_timing("route_topk [" + std::to_string(S) + ", " + std::to_string(E) + "] k " +
                                           std::to_string(p.k),
                                       double(S * E * 4), [&] { (void)cuda::route_topk(dl.p, db.p, S, p, di.p, dw.p, nullptr); });
    }
};

cuda::router_params v41() {
    cuda::router_params p;
    p.n_experts = 384;
    p.k = 6;
    p.route_scale = 1.5f;
    return p;
}

TEST_F(CudaRouter, V41DecodeAndPrefill) {
    check(16, v41(), 1, true);
    check(4096, v41(), 2, true);
}

TEST_F(CudaRouter, FixtureTopOneAndTemperature) {
    cuda::router_params p;
    p.n_experts = 8;
    p.k = 2;
    check(64, p, 3);
    cuda::router_params one = v41();
    one.k = 1;
    check(64, one, 4);
    cuda::router_params t = v41();
    t.gate_temp = 2.0f;
    t.norm_topk_prob = false;
    check(64, t, 5);
}

TEST_F(CudaRouter, RejectsBadShapes) {
    cuda::router_params p = v41();
    p.k = 0;
    EXPECT_FALSE(cuda::route_topk(nullptr, nullptr, 1, p, nullptr, nullptr, nullptr).is_ok());
    p = v41();
    p.n_experts = 2048;
    EXPECT_FALSE(cuda::route_topk(nullptr, nullptr, 1, p, nullptr, nullptr, nullptr).is_ok());
}

}  // namespace
