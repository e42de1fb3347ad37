#include "engine/rope.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"

namespace ds41rt::engine {

rope_table make_rope_table(const model::model_config &c, bool yarn) {
    rope_table t;
    const int dim = c.rope_head_dim;
    t.n_pairs = dim / 2;
    const float base = yarn ? c.compress_rope_theta : c.rope_theta;
    t.inv_freq.resize(size_t(t.n_pairs));
    // YaRN correction range (floor/ceil, clamped), over pair indices.
    double low = 0, high = 0;
    const bool use_yarn = yarn && c.original_seq_len > 0 && c.rope_factor > 1;
    if (use_yarn) {
        auto corr_dim = [&](double rot) {
            return dim * std::log(double(c.original_seq_len) / (rot * 2 * M_PI)) / (2 * std::log(double(base)));
        };
        low = std::max(std::floor(corr_dim(c.beta_fast)), 0.0);
        high = std::min(std::ceil(corr_dim(c.beta_slow)), double(dim - 1));
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < t.n_pairs; i++) {
        float pos_freq = std::pow(base, float(2 * i) / float(dim));
        float extrap = 1.0f / pos_freq;
        if (!use_yarn) {
            t.inv_freq[size_t(i)] = extrap;
            continue;
        }
        float interp = 1.0f / (c.rope_factor * pos_freq);
        float ramp = float(std::clamp((double(i) - low) / (high - low), 0.0, 1.0));
        float extrap_factor = 1.0f - ramp;
        t.inv_freq[size_t(i)] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
    }
    return t;
}

void rope_table::eval(const int64_t *positions, int64_t n, float *cos, float *sin) const {
    for (int64_t r = 0; r < n; r++)
        for (int i = 0; i < n_pairs; i++) {
            float a = float(positions[r]) * inv_freq[size_t(i)];
            cos[r * n_pairs + i] = std::cos(a);
            sin[r * n_pairs + i] = std::sin(a);
        }
}

}  // namespace ds41rt::engine

namespace ds41rt::engine {

void rope_rows(float *x, int64_t n, int64_t dim, const int64_t *pos, const rope_table &t, bool inverse) {
    std::vector<float> cs(n * t.n_pairs), sn(n * t.n_pairs);
    t.eval(pos, n, cs.data(), sn.data());
    backend::cpu::rope_tail(x, n, dim, cs.data(), sn.data(), t.n_pairs, inverse);
}

}  // namespace ds41rt::engine
