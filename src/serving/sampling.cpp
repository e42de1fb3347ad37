// Sampling (see sampling.h for the semantics and the order of the filters).
#include "serving/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace ds41rt::serving {

namespace {

bool in_range(float x, float lo, float hi) { return x >= lo && x <= hi; }  // false for NaN

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

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

}  // namespace

Status validate_sampling_params(const sampling_params &p) {
    if (p.temperature && !in_range(*p.temperature, 0.0f, 2.0f))
        return Status::invalid_argument("temperature: must be in [0, 2]");
    if (!in_range(p.top_p, 0.0f, 1.0f)) return Status::invalid_argument("top_p: must be in [0, 1]");
    if (p.top_k < -1) return Status::invalid_argument("top_k: must be -1, 0 (off) or a positive count");
    if (!in_range(p.min_p, 0.0f, 1.0f)) return Status::invalid_argument("min_p: must be in [0, 1]");
    if (!in_range(p.presence_penalty, -2.0f, 2.0f))
        return Status::invalid_argument("presence_penalty: must be in [-2, 2]");
    if (!in_range(p.frequency_penalty, -2.0f, 2.0f))
        return Status::invalid_argument("frequency_penalty: must be in [-2, 2]");
    if (p.top_logprobs < 0 || p.top_logprobs > MAX_TOP_LOGPROBS)
        return Status::invalid_argument("top_logprobs: must be in [0, 20]");
    if (p.top_logprobs > 0 && !p.logprobs)
        return Status::invalid_argument("top_logprobs: requires logprobs to be true");
    return Status::ok();
}

double sampling_uniform(uint64_t seed, int64_t position) {
    uint64_t x = splitmix64(splitmix64(seed) ^ uint64_t(position) * 0xD1B54A32D192ED03ull);
    return double(x >> 11) * 0x1.0p-53;
}

token_logprobs raw_logprobs(std::span<const float> logits, int32_t id, int32_t k) {
    token_logprobs out;
    const int64_t n = int64_t(logits.size());
    float m = -std::numeric_limits<float>::infinity();
    for (float x : logits) m = std::max(m, x);
    double sum = 0;
    for (float x : logits) sum += std::exp(double(x) - m);
    const double lse = double(m) + std::log(sum);
    auto lp = [&](int32_t i) { return float(double(logits[size_t(i)]) - lse); };
    if (id >= 0 && id < n) out.logprob = lp(id);
    k = std::min<int32_t>(std::clamp(k, 0, MAX_TOP_LOGPROBS), int32_t(n));
    if (k > 0) {
        std::vector<int32_t> idx(static_cast<size_t>(n));
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_value_desc{logits.data()});
        for (int32_t i = 0; i < k; i++) out.top.push_back({idx[size_t(i)], lp(idx[size_t(i)])});
    }
    return out;
}

int32_t sampler_state::sample(std::span<const float> logits, int64_t position, token_logprobs *lp,
                              std::span<const uint32_t> allowed) {
    const size_t n = logits.size();
    work_.assign(logits.begin(), logits.end());
    if (!allowed.empty()) {
        const size_t covered = std::min(n, allowed.size() * 32);
        for (size_t i = 0; i < covered; i++)
            if (!((allowed[i >> 5] >> (i & 31)) & 1u)) work_[i] = -std::numeric_limits<float>::infinity();
        for (size_t i = covered; i < n; i++) work_[i] = -std::numeric_limits<float>::infinity();
    }
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
        for (auto [tok, count] : counts_)
            if (tok >= 0 && size_t(tok) < n)
                work_[size_t(tok)] -= float(count) * p_.frequency_penalty + p_.presence_penalty;
    }
    int32_t chosen;
    if (p_.greedy()) {
        chosen = argmax_lowest(work_);
    } else {
        const float inv_t = 1.0f / *p_.temperature;
        float m = -std::numeric_limits<float>::infinity();
        for (float &x : work_) {
            x *= inv_t;
            m = std::max(m, x);
        }
        // min_p in logit space; -inf (masked) never survives.
        const float floor = p_.min_p > 0.0f ? m + std::log(p_.min_p) : -std::numeric_limits<float>::infinity();
        order_.clear();
        for (size_t i = 0; i < n; i++)
            if (work_[i] >= floor && work_[i] > -std::numeric_limits<float>::infinity()) order_.push_back(int32_t(i));
        if (order_.empty()) order_.push_back(argmax_lowest(work_));
        by_value_desc cmp{work_.data()};
        const bool use_k = p_.top_k > 0 && size_t(p_.top_k) < order_.size();
        if (use_k) {
            std::nth_element(order_.begin(), order_.begin() + p_.top_k, order_.end(), cmp);
            order_.resize(size_t(p_.top_k));
        }
        // The descending order matters only for top_p; otherwise candidates stay in id order,
        // which is just as deterministic and avoids sorting the whole vocabulary.
        const bool use_p = p_.top_p < 1.0f;
        if (use_p || use_k) std::sort(order_.begin(), order_.end(), cmp);
        double total = 0;
        std::vector<double> mass(order_.size());
        for (size_t j = 0; j < order_.size(); j++) {
            mass[j] = std::exp(double(work_[size_t(order_[j])]) - m);
            total += mass[j];
        }
        size_t kept = order_.size();
        if (use_p) {
            const double target = double(p_.top_p) * total;
            double cum = 0;
            for (size_t j = 0; j < order_.size(); j++) {
                cum += mass[j];
                if (cum >= target) {
                    kept = j + 1;
                    break;
                }
            }
            total = 0;
            for (size_t j = 0; j < kept; j++) total += mass[j];
        }
        const double u = sampling_uniform(seed_, position) * total;
        double cum = 0;
        chosen = order_[kept - 1];
        for (size_t j = 0; j < kept; j++) {
            cum += mass[j];
            if (u < cum) {
                chosen = order_[j];
                break;
            }
        }
    }
    if (lp && p_.logprobs) *lp = raw_logprobs(logits, chosen, p_.top_logprobs);
    return chosen;
}

}  // namespace ds41rt::serving
