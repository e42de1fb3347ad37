// The sampling arithmetic on one logits row, shared by the serving sampler (its only caller on
// the CPU) and the CUDA sampler's tests (backend/cuda/sampling.cuh must pick what this picks).
// It lives here, below serving, so the GPU tests can link it and the two cannot drift.
//
// Order (reference system §3.2): grammar mask -> penalties -> (greedy: argmax, lowest id on
// ties) temperature -> min_p -> top_k -> top_p -> one draw. serving/sampling.h states the
// client-facing semantics; this header states the arithmetic, because the GPU repeats it bit for
// bit wherever it can:
//  - penalties: w[t] -= float(count) * frequency + presence, each product and sum rounded in fp32
//    (no fused multiply-add; sampling_math.cpp is built with -ffp-contract=off);
//  - temperature: w *= inv_temperature, with inv_temperature = 1.0f / temperature (fp32);
//  - min_p: keep w >= max(w) + log_min_p, log_min_p = std::log(min_p) in fp32 computed on the
//    host (sampling_log_min_p), so the GPU need not reproduce a libm logf;
//  - masses exp(double(w) - max) in fp64; top_k/top_p walk candidates in (value desc, id asc)
//    order; without either, the walk is in id order;
//  - the uniform: sampling_uniform(seed, position), 53 bits of splitmix64, exact on both sides.
#pragma once

#include <span>
#include <vector>

#include "backend/cpu/sampling_row.h"

namespace ds41rt::backend::cpu {

// -inf for min_p <= 0 (off), else std::log(min_p) in fp32.
float sampling_log_min_p(float min_p);

// How close the draw (and the top_p cut) came to a boundary between two candidates, as a
// fraction of the mass it was compared against: another summation order can flip the result
// only when this is within rounding distance. 1 when there was no such comparison.
struct sample_trace {
    double draw_margin = 1.0;
    double top_p_margin = 1.0;
};

// Picks the token from `logits` with uniform u in [0, 1). `allowed`, when not empty, is a token
// bitmask (bit i of word i/32; tokens beyond it are disallowed). work/order are scratch the
// caller keeps between calls.
int32_t sample_row(std::span<const float> logits, const row_sampling &p, std::span<const token_count> counts,
                   std::span<const uint32_t> allowed, double u, std::vector<float> &work,
                   std::vector<int32_t> &order, sample_trace *trace = nullptr);

struct id_logprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

// log_softmax(logits)[id] (fp64 log-sum-exp, one rounding) and the k most likely tokens
// (value desc, id asc), k clamped to [0, min(20, n)].
float raw_logprob(std::span<const float> logits, int32_t id, int32_t k, std::vector<id_logprob> *top);

}  // namespace ds41rt::backend::cpu
