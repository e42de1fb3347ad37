// The sampling arithmetic (see sampling_math.h for the order and the rounding of each step).
#include "backend/cpu/sampling_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ds41rt::backend::cpu {

namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// Higher value first; equal values: lower id first (the reference's tie rule).
struct by_value_desc {
    const float *v;
    bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

int32_t argmax_lowest(std::span<const float> v) {
    size_t best = 0;
    for (size_t i = 1; i < v.size(); i++)
        if (v[i] > v[best]) best = i;
    return int32_t(best);
}

// Distance of x from the interval [lo, hi]'s nearer end, relative to scale.
double margin(double x, double lo, double hi, double scale) {
    return std::min(std::fabs(x - lo), std::fabs(hi - x)) / scale;
}

}  // namespace

float sampling_log_min_p(float min_p) { return min_p > 0.0f ? std::log(min_p) : NEG_INF; }

int32_t sample_row(std::span<const float> logits, const row_sampling &p, std::span<const token_count> counts,
                   std::span<const uint32_t> allowed, double u, std::vector<float> &work,
                   std::vector<int32_t> &order, sample_trace *trace) {
    const size_t n = logits.size();
    work.assign(logits.begin(), logits.end());
    if (!allowed.empty()) {
        const size_t covered = std::min(n, allowed.size() * 32);
        for (size_t i = 0; i < covered; i++)
            if (!((allowed[i >> 5] >> (i & 31)) & 1u)) work[i] = NEG_INF;
        for (size_t i = covered; i < n; i++) work[i] = NEG_INF;
    }
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
        for (auto [tok, count] : counts)
            if (tok >= 0 && size_t(tok) < n) work[size_t(tok)] -= float(count) * p.frequency_penalty + p.presence_penalty;
    }
    if (p.greedy) return argmax_lowest(work);

    float m = NEG_INF;
    for (float &x : work) {
        x *= p.inv_temperature;
        m = std::max(m, x);
    }
    // min_p in logit space; -inf (masked) never survives.
    const float floor = p.log_min_p > NEG_INF ? m + p.log_min_p : NEG_INF;
    order.clear();
    for (size_t i = 0; i < n; i++)
        if (work[i] >= floor && work[i] > NEG_INF) order.push_back(int32_t(i));
    if (order.empty()) order.push_back(argmax_lowest(work));
    by_value_desc cmp{work.data()};
    const bool use_k = p.top_k > 0 && size_t(p.top_k) < order.size();
    if (use_k) {
        std::nth_element(order.begin(), order.begin() + p.top_k, order.end(), cmp);
        order.resize(size_t(p.top_k));
    }
    // The descending order matters only for top_p and top_k; otherwise candidates stay in id
    // order, which is just as deterministic and avoids sorting the whole vocabulary.
    const bool use_p = p.top_p < 1.0f;
    if (use_p || use_k) std::sort(order.begin(), order.end(), cmp);
    double total = 0;
    std::vector<double> mass(order.size());
    for (size_t j = 0; j < order.size(); j++) {
        mass[j] = std::exp(double(work[size_t(order[j])]) - m);
        total += mass[j];
    }
    size_t kept = order.size();
    if (use_p) {
        const double target = double(p.top_p) * total;
        double cum = 0;
        for (size_t j = 0; j < order.size(); j++) {
            cum += mass[j];
            if (cum >= target) {
                kept = j + 1;
                if (trace) trace->top_p_margin = margin(target, cum - mass[j], cum, total);
                break;
            }
        }
        total = 0;
        for (size_t j = 0; j < kept; j++) total += mass[j];
    }
    const double x = u * total;
    double cum = 0;
    int32_t chosen = order[kept - 1];
    for (size_t j = 0; j < kept; j++) {
        cum += mass[j];
        if (x < cum) {
            chosen = order[j];
            if (trace) trace->draw_margin = margin(x, cum - mass[j], cum, total);
            break;
        }
    }
    return chosen;
}

float raw_logprob(std::span<const float> logits, int32_t id, int32_t k, std::vector<id_logprob> *top) {
    const int64_t n = int64_t(logits.size());
    float m = NEG_INF;
    for (float x : logits) m = std::max(m, x);
    double sum = 0;
    for (float x : logits) sum += std::exp(double(x) - m);
    const double lse = double(m) + std::log(sum);
    auto lp = [&](int32_t i) { return float(double(logits[size_t(i)]) - lse); };
    if (top) {
        top->clear();
        k = int32_t(std::min<int64_t>(std::clamp(k, 0, 20), n));
        if (k > 0) {
            std::vector<int32_t> idx(static_cast<size_t>(n));
            std::iota(idx.begin(), idx.end(), 0);
            std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_value_desc{logits.data()});
            for (int32_t i = 0; i < k; i++) top->push_back({idx[size_t(i)], lp(idx[size_t(i)])});
        }
    }
    return id >= 0 && id < n ? lp(id) : 0.0f;
}

}  // namespace ds41rt::backend::cpu
