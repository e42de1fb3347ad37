// Sampling (see sampling.h for the semantics and the order of the filters).
#include "serving/sampling.h"

#include <algorithm>
#include <string>

namespace ds41rt::serving {

namespace {

bool in_range(float x, float lo, float hi) { return x >= lo && x <= hi; }  // false for NaN

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

double sampling_uniform(uint64_t seed, int64_t position) { return backend::cpu::sampling_uniform(seed, position); }

backend::cpu::row_sampling row_params(const sampling_params &p) {
    backend::cpu::row_sampling r;
    r.greedy = p.greedy();
    if (!r.greedy) r.inv_temperature = 1.0f / *p.temperature;
    r.top_p = p.top_p;
    r.top_k = p.top_k;
    r.log_min_p = backend::cpu::sampling_log_min_p(p.min_p);
    r.presence_penalty = p.presence_penalty;
    r.frequency_penalty = p.frequency_penalty;
    return r;
}

engine::sample_spec sampler_state::spec(int64_t position, std::span<const uint32_t> allowed) const {
    engine::sample_spec s;
    s.p = row_params(p_);
    s.seed = seed_;
    s.position = position;
    for (auto [tok, count] : counts_) s.counts.push_back({tok, count});
    s.allowed.assign(allowed.begin(), allowed.end());
    s.logprobs = p_.logprobs;
    s.top_logprobs = std::min(p_.top_logprobs, MAX_TOP_LOGPROBS);
    return s;
}

token_logprobs to_token_logprobs(const engine::sample_result &r) {
    token_logprobs out;
    out.logprob = r.logprob;
    for (auto t : r.top) out.top.push_back({t.id, t.logprob});
    return out;
}

int32_t sampler_state::sample(std::span<const float> logits, int64_t position, token_logprobs *lp,
                              std::span<const uint32_t> allowed) const {
    const engine::sample_result r = engine::sample_on_host(logits, spec(position, allowed));
    if (lp && p_.logprobs) *lp = to_token_logprobs(r);
    return r.token;
}

}  // namespace ds41rt::serving
