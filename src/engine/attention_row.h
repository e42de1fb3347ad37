// Sparse attention of one query head over its gathered key list, shared by V4 and V4.1 (the
// reference's sparse_attn): K = V (one shared latent head), a per-head sink that joins only the
// softmax denominator, invalid indices skipped.
#pragma once

#include <cstdint>
#include <vector>

namespace ds41rt::engine {

struct attn_scratch {
    std::vector<float> scores;
    std::vector<double> acc;
};

// out[hd] = sum_i softmax_i(q . k_i * scale | sink) k_i over keys (nullptr = index -1).
//  - TRANSFORMERS: one softmax over all scores and the sink, P.V accumulated in fp64.
//  - OFFICIAL (official = true): the reference kernel: online softmax over blocks of 64 indices
//    with the running max over real scores only; each block's exp(score - max) summed in fp32
//    into the denominator and cast to bf16 for P.V; the sink's exp joins the denominator last;
//    bf16 output.
void attend_row(const float *q, const std::vector<const float *> &keys, float sink, float scale, int64_t hd,
                bool official, attn_scratch &scratch, float *out);

}  // namespace ds41rt::engine
