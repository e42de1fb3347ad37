#include "backend/cpu/swiglu.h"

#include <algorithm>
#include <vector>

namespace ds41rt::backend::cpu {

void swiglu_expert(const expert_numerics &nm, const Tensor &w1, const Tensor &w2, const Tensor &w3, const float *x,
                   int64_t n, int64_t D, const float *row_weight, float *y) {
    const int64_t I = w1.dim(0);
    std::vector<float> g(n * I), u(n * I);
    linear_numerics(nm.official, nm.act_block, x, w1.f(), g.data(), n, I, D, nm.kind);
    linear_numerics(nm.official, nm.act_block, x, w3.f(), u.data(), n, I, D, nm.kind);
    const float lim = nm.swiglu_limit;
    const bool weight_before = row_weight && !nm.weight_after_w2;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < I; i++) {
            float gv = g[size_t(r * I + i)], uv = u[size_t(r * I + i)];
            if (lim > 0) {
                uv = std::clamp(uv, -lim, lim);
                gv = std::min(gv, lim);
            }
            float h = silu(gv) * uv;
            if (weight_before) h = row_weight[r] * h;  // fp32, before the bf16 cast
            g[size_t(r * I + i)] = h;
        }
    round_bf16_if(nm.official, g.data(), n * I);
    linear_numerics(nm.official, nm.act_block, g.data(), w2.f(), y, n, D, I, nm.kind);
    if (row_weight && nm.weight_after_w2)
        for (int64_t r = 0; r < n; r++)
            for (int64_t d = 0; d < D; d++) y[r * D + d] *= row_weight[r];
}

}  // namespace ds41rt::backend::cpu
