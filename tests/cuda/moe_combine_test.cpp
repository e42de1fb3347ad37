// The MoE prefill combine (backend/cuda sum_routes) against the host fold it must equal bit for
// bit: acc[t] = 0 + v_0 + v_1 + ... in fp32 over row t's routes in increasing expert id, v = the
// expert's output row, bf16-rounded first in OFFICIAL, times the route weight when the weight comes
// after w2 (backend/cpu routed_expert_sum's combine), and against scatter_add_rows run expert by
// expert on a zeroed acc (the path it replaced). Random routes at V4.1's shapes (384 experts, top 6,
// dim 5120), rows with dropped picks (-1) included; acc is NaN-poisoned, so every element is
// written. Tolerance: 0 bits.
#include <gtest/gtest.h>

#include <random>

#include "backend/cuda/elementwise.cuh"
#include "core/dtype.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

class CudaMoeCombine : public testing_util::CudaOps {};

TEST_F(CudaMoeCombine, SumRoutesEqualsTheExpertOrderFold) {
    const int64_t S = 97, D = 5120, E = 384;
    const int K = 6;
    std::mt19937 rng(7);
    // Routes: K distinct experts a row, every 10th row with its last pick dropped.
    std::vector<std::vector<std::pair<int32_t, int32_t>>> by_expert(static_cast<size_t>(E));  // (row, route)
    std::vector<float> w;
    for (int64_t t = 0; t < S; t++) {
        std::vector<int32_t> picks;
        while (int(picks.size()) < K) {
            const int32_t e = int32_t(rng() % E);
            if (std::find(picks.begin(), picks.end(), e) == picks.end()) picks.push_back(e);
        }
        for (int k = 0; k < K - (t % 10 == 0); k++) by_expert[size_t(picks[size_t(k)])].push_back({int32_t(t), 0});
    }
    // Sorted by expert: idx (rows), pos (each row's routes in increasing expert id).
    std::vector<int32_t> idx, pos(static_cast<size_t>(S * K), -1), filled(static_cast<size_t>(S), 0);
    std::vector<int64_t> first(static_cast<size_t>(E) + 1, 0);
    for (int64_t e = 0; e < E; e++) {
        for (auto &[t, r] : by_expert[size_t(e)]) {
            pos[size_t(t * K + filled[size_t(t)]++)] = int32_t(idx.size());
            idx.push_back(t);
            w.push_back(std::uniform_real_distribution<float>(0.01f, 0.5f)(rng));
        }
        first[size_t(e) + 1] = int64_t(idx.size());
    }
    const int64_t R = int64_t(idx.size());
    std::vector<float> y = testing_util::random_normal(size_t(R * D), 11);
    for (auto &v : y) v *= 3.0f;
    dev_vec<float> dy(y), dw(w), acc(size_t(S * D)), ref_acc(size_t(S * D));
    dev_vec<int32_t> dpos(pos), didx(idx);
    for (bool rb : {false, true})
        for (bool weighted : {false, true}) {
            const std::string what = std::string(rb ? "bf16" : "fp32") + (weighted ? ", weight after w2" : "");
            std::vector<float> host(static_cast<size_t>(S * D), 0.0f);
            for (int64_t e = 0; e < E; e++)
                for (int64_t p = first[size_t(e)]; p < first[size_t(e) + 1]; p++)
                    for (int64_t d = 0; d < D; d++) {
                        float v = y[size_t(p * D + d)];
                        if (rb) v = round_bf16(v);
                        if (weighted) v = v * w[size_t(p)];
                        host[size_t(idx[size_t(p)] * D + d)] += v;
                    }
            acc.poison();
            ASSERT_TRUE(cuda::sum_routes(acc.p, dy.p, dpos.p, weighted ? dw.p : nullptr, S, K, D, rb, nullptr).is_ok());
            EXPECT_EQ(testing_util::bit_mismatches(acc.download(), host, "sum_routes " + what), 0u);
            ASSERT_EQ(cudaMemset(ref_acc.p, 0, ref_acc.n * sizeof(float)), cudaSuccess);
            for (int64_t e = 0; e < E; e++) {
                const int64_t n = first[size_t(e) + 1] - first[size_t(e)];
                ASSERT_TRUE(cuda::scatter_add_rows(ref_acc.p, dy.p + first[size_t(e)] * D, didx.p + first[size_t(e)],
                                                   weighted ? dw.p + first[size_t(e)] : nullptr, n, D, rb, nullptr)
                                .is_ok());
            }
            EXPECT_EQ(testing_util::bit_mismatches(acc.download(), ref_acc.download(), "sum_routes vs scatter " + what), 0u);
        }
    std::printf("[ moe combine ] sum_routes: %lld rows, %lld routes, dim %lld: 0 bits from the host fold and from "
                "scatter_add_rows per expert (both numerics, weight before / after w2)\n",
                (long long)S, (long long)R, (long long)D);
}

}  // namespace
