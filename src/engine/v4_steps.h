// The V4 Flash steps that are loops over activations already computed: the overlapping
// compressors' window pooling and the router (hash and learned). The CPU forward pass
// (v4_model) runs them on its host arrays; the GPU engine (engine/cuda/v4_gpu) runs them on
// rows it brought back from the device, so both engines share one definition of each.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/routed.h"
#include "model/config.h"

namespace ds41rt::engine::v4 {

// One compressor's open windows (spec 3.5). Tokens of the open window wait in buf_* (raw
// projections, ape not yet added); with overlap, prev_* keeps the Ca half (kv and ape-biased
// gate) of the last closed window, which the next window's entry pools over (transformers'
// overlap_kv / overlap_gate).
struct compressor_buffer {
    std::vector<float> buf_kv, buf_gate;  // [n_buf, c*d]  (c = 2 with overlap)
    int64_t n_buf = 0;
    bool has_prev = false;
    std::vector<float> prev_kv, prev_gate;  // [m, d]
};

// Appends S projected rows (kv, gate: [S, c*d]) and closes every window that completes: per
// closed window one latent row, pooled per channel by an fp32 softmax over the window's tokens
// of (gate + ape[p mod m]) (with overlap: the previous window's Ca half, then this window's Cb
// half; the first window of a sequence has no previous one). ape: [m, c*d]. Returns the latents
// [groups, d] (not rounded, normed nor rotated) and sets *groups.
std::vector<float> compress_pool(compressor_buffer &st, const float *kv, const float *gate, int64_t S, int64_t d,
                                 int ratio, bool overlap, const float *ape, int64_t *groups);

// The router (spec 3.9) from gate logits [S, E]: score = sqrt(softplus(logit)); experts from
// tid2eid[token] (hash layers, tid2eid non-null: [vocab, K]) or the top-K of score + bias;
// weights = score / sum of the picks' scores (+1e-20 unless official) * route_scale.
backend::cpu::route_table route(const model::model_config &c, const float *logits, int64_t S, const int32_t *tid2eid,
                                const float *bias, const int32_t *tokens, bool official);

}  // namespace ds41rt::engine::v4
