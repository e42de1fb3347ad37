#include "backend/cpu/routed.h"

#include "backend/cpu/quant_ops.h"

#include <algorithm>
#include <string>

namespace ds41rt::backend::cpu {

route_table route_table_from(const int32_t *ids, const float *weights, int64_t S, int K) {
    route_table rt;
    rt.offsets.push_back(0);
    for (int64_t r = 0; r < S; r++) {
        for (int64_t k = 0; k < K; k++)
            if (ids[r * K + k] >= 0) rt.routes.push_back({uint32_t(ids[r * K + k]), weights[r * K + k]});
        rt.offsets.push_back(uint32_t(rt.routes.size()));
    }
    return rt;
}

Status routed_expert_sum(const expert_numerics &nm, const std::vector<expert_weights> &experts, const float *x,
                         int64_t D, const route_table &rt, float *acc) {
    const int64_t S = rt.rows(), E = int64_t(experts.size());
    std::vector<std::vector<std::pair<int64_t, float>>> by_expert(E);  // (row, weight)
    for (int64_t s = 0; s < S; s++)
        for (uint32_t i = rt.offsets[size_t(s)]; i < rt.offsets[size_t(s + 1)]; i++) {
            const route &r = rt.routes[i];
            if (int64_t(r.expert) >= E || experts[r.expert].w1.empty())
                return Status::invalid_argument("routed experts: row " + std::to_string(s) + " routes to expert " +
                                                std::to_string(r.expert) + ", which is not held here");
            by_expert[r.expert].push_back({s, r.weight});
        }
    std::fill(acc, acc + S * D, 0.0f);
    for (int64_t e = 0; e < E; e++) {
        const auto &rows = by_expert[size_t(e)];
        if (rows.empty()) continue;
        const int64_t n = int64_t(rows.size());
        std::vector<float> xe(n * D), ye(n * D), we(n);
        for (int64_t i = 0; i < n; i++) {
            std::copy(x + rows[size_t(i)].first * D, x + (rows[size_t(i)].first + 1) * D, xe.data() + i * D);
            we[size_t(i)] = rows[size_t(i)].second;
        }
        const expert_weights &w = experts[size_t(e)];
        if (w.w13_input_scale > 0)
            nvfp4_w4a4_expert(nm, w.w1.f(), w.w2.f(), w.w3.f(), w.w1.dim(0), w.w13_input_scale, w.w2_input_scale,
                              xe.data(), n, D, we.data(), ye.data());
        else
            swiglu_expert(nm, w.w1, w.w2, w.w3, xe.data(), n, D, we.data(), ye.data());
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = 0; d < D; d++) acc[rows[size_t(i)].first * D + d] += ye[size_t(i * D + d)];
    }
    return Status::ok();
}

}  // namespace ds41rt::backend::cpu
