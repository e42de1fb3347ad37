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
// V4 (engine v4_steps.cpp route(), its loop repeated here likewise): E 256, top 6, route_scale
// 1.5; OFFICIAL normalizes without the +1e-20 (route_topk with eps = false), and hash layers
// take the picks from tid2eid[token] (route_hash), in both normalizations. The 1e-20 matters only
// when the picks' score sum is tiny: a case with scores ~1e-19 shows the two modes apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

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
        if (p.norm_topk_prob && p.k > 1) wgt = wgt / (p.eps ? sum + 1e-20f : sum);
        ids.push_back(int32_t(e));
        w.push_back(wgt * p.route_scale);
    }
}

// The host's V4 routing of one token (v4_steps.cpp route()): hash picks from the table row, or
// the top k of the biased scores; always renormalized, +1e-20 unless official.
void host_route_v4(const float *logits, const float *bias, const int32_t *hash_row, int64_t E, int64_t K,
                   float route_scale, bool official, std::vector<int32_t> &ids, std::vector<float> &w) {
    std::vector<float> score(E), biased(E);
    for (int64_t e = 0; e < E; e++) {
        const float v = logits[e];
        const float sp = v > 20.0f ? v : std::log1p(std::exp(v));
        score[size_t(e)] = std::sqrt(sp);
        if (!hash_row) biased[size_t(e)] = score[size_t(e)] + bias[e];
    }
    std::vector<int64_t> sel;
    if (hash_row) sel.assign(hash_row, hash_row + K);
    else sel = engine::top_indices(biased.data(), E, K);
    float sum = 0;
    for (int64_t e : sel) sum += score[size_t(e)];
    const float den = official ? sum : sum + 1e-20f;
    ids.clear();
    w.clear();
    for (int64_t e : sel) {
        ids.push_back(int32_t(e));
        w.push_back(score[size_t(e)] / den * route_scale);
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

// GPU ids / weights against the host's, the metric of check(); returns the worst ulp.
int64_t compare_routes(const std::vector<int32_t> &gi, const std::vector<float> &gw, const std::vector<int32_t> &ri,
                       const std::vector<float> &rw, const std::string &what) {
    EXPECT_EQ(gi.size(), ri.size()) << what;
    int64_t bad_ids = 0, bits = 0, worst = 0;
    for (size_t i = 0; i < std::min(gi.size(), ri.size()); i++) {
        if (gi[i] != ri[i]) {
            if (bad_ids++ < 3) ADD_FAILURE() << what << " route " << i << ": id " << gi[i] << " vs " << ri[i];
            continue;
        }
        if (!std::isfinite(gw[i])) {
            ADD_FAILURE() << what << " route " << i << ": weight not written";
            continue;
        }
        bits += f32_bits(gw[i]) != f32_bits(rw[i]);
        const int64_t u = testing_util::ulp_distance(gw[i], rw[i]);
        worst = std::max(worst, u);
        EXPECT_LE(u, 4) << what << " route " << i << ": " << gw[i] << " vs " << rw[i];
    }
    EXPECT_EQ(bad_ids, 0) << what;
    std::printf("[ info ] %s: %lld id mismatches, weights: %lld bit mismatches of %zu, max %lld ulp\n", what.c_str(),
                (long long)bad_ids, (long long)bits, gi.size(), (long long)worst);
    return worst;
}

constexpr int V4_E = 256, V4_K = 6;

cuda::router_params v4(bool official) {
    cuda::router_params p;
    p.n_experts = V4_E;
    p.k = V4_K;
    p.route_scale = 1.5f;
    p.eps = !official;
    return p;
}

// Logits as check() draws them; `tiny` puts every score near 4e-18 (logits ~ -80: softplus ~
// e^v ~ 2e-35, still a normal float; its sqrt ~ 4e-18): six picks sum to ~2.5e-17, which the
// +1e-20 moves by ~4e-4 relative, thousands of ulps.
std::vector<float> v4_logits(int64_t S, uint32_t seed, bool tiny) {
    std::vector<float> l = testing_util::random_normal(size_t(S * V4_E), seed);
    for (size_t i = 0; i < l.size(); i++) l[i] = tiny ? -80.0f + 0.5f * l[i] : l[i] * ((i % 17 == 0) ? 12.0f : 3.0f);
    return l;
}

TEST_F(CudaRouter, V4TopkBothNormalizations) {
    const int64_t S = 64;
    for (bool tiny : {false, true}) {
        const std::vector<float> logits = v4_logits(S, 11 + tiny, tiny);
        std::vector<float> bias = testing_util::random_normal(size_t(V4_E), 13);
        for (auto &b : bias) b *= tiny ? 1e-19f : 0.1f;  // tiny: the bias must not swamp the scores
        dev_vec<float> dl(logits), db(bias), dw(size_t(S * V4_K));
        dev_vec<int32_t> di(size_t(S * V4_K));
        std::vector<float> w_mode[2];
        for (bool official : {false, true}) {
            di.poison();
            dw.poison();
            ASSERT_TRUE(cuda::route_topk(dl.p, db.p, S, v4(official), di.p, dw.p, nullptr).is_ok());
            std::vector<int32_t> ri, ti;
            std::vector<float> rw, tw;
            for (int64_t s = 0; s < S; s++) {
                host_route_v4(logits.data() + s * V4_E, bias.data(), nullptr, V4_E, V4_K, 1.5f, official, ti, tw);
                ri.insert(ri.end(), ti.begin(), ti.end());
                rw.insert(rw.end(), tw.begin(), tw.end());
            }
            w_mode[official] = dw.download();
            compare_routes(di.download(), w_mode[official], ri, rw,
                           std::string("V4 top-k ") + (official ? "official" : "reference") + (tiny ? " tiny scores" : ""));
        }
        // The flag must reach the kernel: tiny scores tell the two denominators apart.
        if (tiny) {
            EXPECT_NE(w_mode[0], w_mode[1]);
        }
    }
}

TEST_F(CudaRouter, V4HashBothNormalizations) {
    const int64_t S = 64, vocab = 1000;
    std::mt19937 rng(21);
    std::vector<int32_t> table(size_t(vocab * V4_K));
    for (int64_t t = 0; t < vocab; t++) {  // distinct ids per row, in random order
        std::vector<int32_t> all(V4_E);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        std::copy(all.begin(), all.begin() + V4_K, table.begin() + t * V4_K);
    }
    std::vector<int32_t> tokens(S);
    for (auto &t : tokens) t = int32_t(rng() % vocab);
    tokens[5] = tokens[9];  // a repeated token
    for (bool tiny : {false, true}) {
        const std::vector<float> logits = v4_logits(S, 31 + tiny, tiny);
        dev_vec<float> dl(logits), dw(size_t(S * V4_K));
        dev_vec<int32_t> dt(table), dtok(tokens), di(size_t(S * V4_K));
        std::vector<float> w_mode[2];
        for (bool official : {false, true}) {
            di.poison();
            dw.poison();
            ASSERT_TRUE(cuda::route_hash(dl.p, dt.p, vocab, dtok.p, S, v4(official), di.p, dw.p, nullptr).is_ok());
            std::vector<int32_t> ri, ti;
            std::vector<float> rw, tw;
            for (int64_t s = 0; s < S; s++) {
                host_route_v4(logits.data() + s * V4_E, nullptr, table.data() + int64_t(tokens[size_t(s)]) * V4_K, V4_E,
                              V4_K, 1.5f, official, ti, tw);
                ri.insert(ri.end(), ti.begin(), ti.end());
                rw.insert(rw.end(), tw.begin(), tw.end());
            }
            w_mode[official] = dw.download();
            compare_routes(di.download(), w_mode[official], ri, rw,
                           std::string("V4 hash ") + (official ? "official" : "reference") + (tiny ? " tiny scores" : ""));
        }
        if (tiny) {
            EXPECT_NE(w_mode[0], w_mode[1]);
        }
    }
    // A token outside the table: its picks are dropped (id -1, weight 0), the others unaffected.
    tokens[3] = int32_t(vocab);
    const std::vector<float> logits = v4_logits(S, 41, false);
    dev_vec<float> dl(logits), dw(size_t(S * V4_K));
    dev_vec<int32_t> dt(table), dtok(tokens), di(size_t(S * V4_K));
    di.poison();
    dw.poison();
    ASSERT_TRUE(cuda::route_hash(dl.p, dt.p, vocab, dtok.p, S, v4(true), di.p, dw.p, nullptr).is_ok());
    const std::vector<int32_t> gi = di.download();
    const std::vector<float> gw = dw.download();
    for (int r = 0; r < V4_K; r++) {
        EXPECT_EQ(gi[size_t(3 * V4_K + r)], -1);
        EXPECT_EQ(gw[size_t(3 * V4_K + r)], 0.0f);
        EXPECT_GE(gi[size_t(4 * V4_K + r)], 0);
    }
}

TEST_F(CudaRouter, RejectsBadShapes) {
    cuda::router_params p = v41();
    p.k = 0;
    EXPECT_FALSE(cuda::route_topk(nullptr, nullptr, 1, p, nullptr, nullptr, nullptr).is_ok());
    p = v41();
    p.n_experts = 2048;
    EXPECT_FALSE(cuda::route_topk(nullptr, nullptr, 1, p, nullptr, nullptr, nullptr).is_ok());
    EXPECT_FALSE(cuda::route_hash(nullptr, nullptr, 10, nullptr, 1, p, nullptr, nullptr, nullptr).is_ok());
    p = v41();
    EXPECT_FALSE(cuda::route_hash(nullptr, nullptr, 0, nullptr, 1, p, nullptr, nullptr, nullptr).is_ok());
    EXPECT_FALSE(cuda::route_hash(nullptr, nullptr, 10, nullptr, 1, p, nullptr, nullptr, nullptr).is_ok());
}

}  // namespace
