// Sampling: one logits row (plus the tokens this request has generated so far) to the next token
// id, and the log-probabilities the client asked for.
//
// Semantics (reference system §3.2; where OpenAI differs it is said here):
//  - temperature omitted or < 1e-5 is GREEDY (argmax, lowest id on ties). OpenAI's documented
//    default is 1.0; the reference serves DeepSeek greedy unless asked, and so do we.
//  - a grammar mask first (disallowed tokens become -inf), when the request has a grammar;
//  - then penalties, on the raw logits, over the tokens generated so far (not the prompt), as
//    OpenAI documents: logit[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty.
//    They apply to greedy decoding too.
//  - then, when not greedy: temperature -> min_p -> top_k -> top_p, then one draw.
//    min_p is compared in logit space (scaled >= max + ln(min_p)); top_k 0 or -1 disables it and
//    ties keep the lowest token id; top_p keeps the inclusive descending prefix whose mass
//    reaches p (at least one token).
//  - the draw: u in [0, 1) from a counter-based generator keyed by (seed, position of the token
//    in the output), so the same seed and prompt give the same output whatever else is batched
//    with the request. No seed: the scheduler picks a random one per request.
//  - logprobs are those of the RAW distribution (log_softmax of the logits the model produced,
//    before penalties and temperature), as OpenAI reports them; top_logprobs are the k most likely
//    raw tokens (ties: lowest id), up to 20.
//
// Threading: pure functions; a sampler_state belongs to one request.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/cpu/sampling_math.h"
#include "core/status.h"
#include "engine/engine.h"

namespace ds41rt::serving {

inline constexpr float GREEDY_TEMPERATURE = 1e-5f;
inline constexpr int32_t MAX_TOP_LOGPROBS = 20;

struct sampling_params {
    std::optional<float> temperature;  // omitted: greedy (see above)
    float top_p = 1.0f;                // (0, 1]
    int32_t top_k = 0;                 // 0 or -1: off
    float min_p = 0.0f;                // [0, 1]
    float presence_penalty = 0.0f;     // [-2, 2]
    float frequency_penalty = 0.0f;    // [-2, 2]
    std::optional<int64_t> seed;       // signed 64-bit, used as its bit pattern
    bool logprobs = false;             // report the chosen token's logprob
    int32_t top_logprobs = 0;          // 0..20 alternatives per position (needs logprobs)

    bool greedy() const { return !temperature || *temperature < GREEDY_TEMPERATURE; }
};

// Range checks; INVALID_ARGUMENT naming the field ("temperature: must be in [0, 2]").
Status validate_sampling_params(const sampling_params &p);

struct top_logprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

struct token_logprobs {
    float logprob = 0.0f;             // of the chosen token
    std::vector<top_logprob> top;     // most likely first
};

// Per-request sampling state: the generated-token counts the penalties need.
class sampler_state {
public:
    sampler_state(const sampling_params &p, uint64_t seed) : p_(p), seed_(seed) {}

    // Picks the token for output position `position` (0 = first generated token) from one
    // logits row; fills *lp when p.logprobs (may be null otherwise). Does not record the token:
    // call accept() with what was finally chosen. `allowed`, when not empty, is a grammar's
    // token bitmask (text/grammar.h): tokens outside it are masked to -inf before anything else
    // (the reference's order: mask -> penalties -> temperature -> ...).
    int32_t sample(std::span<const float> logits, int64_t position, token_logprobs *lp,
                   std::span<const uint32_t> allowed = {}) const;
    void accept(int32_t token) { counts_[token]++; }
    // What sample() computes, as the engine's sampler takes it (engine::step_sampled: the GPU
    // engines pick on the device). allowed as for sample().
    engine::sample_spec spec(int64_t position, std::span<const uint32_t> allowed = {}) const;

    const sampling_params &params() const { return p_; }
    uint64_t seed() const { return seed_; }

private:
    sampling_params p_;
    uint64_t seed_;
    std::unordered_map<int32_t, int32_t> counts_;
};

// The row arithmetic's parameters (backend/cpu/sampling_math.h) for a request: the GPU sampler
// takes the same values, so both round temperature and min_p identically.
backend::cpu::row_sampling row_params(const sampling_params &p);

// The uniform draw in [0, 1) for (seed, position): splitmix64 of both, 53 bits
// (backend/cpu/sampling_math.h, shared with the GPU sampler).
double sampling_uniform(uint64_t seed, int64_t position);

// A pick's logprobs as reported to clients.
token_logprobs to_token_logprobs(const engine::sample_result &r);

}  // namespace ds41rt::serving
