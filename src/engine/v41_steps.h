// The V4.1 steps that are loops over activations already computed (no weights, no state): the
// compressor's softmax pooling, the indexer's scores and selections, the Engram gate, and the
// router. The CPU forward pass (v41_model) runs them on its host arrays. The GPU engine
// (engine/cuda) runs the router and the TRANSFORMERS selections (torch's tie order) here, on rows
// it brought back from the device, so both engines share those definitions and tie rules; the
// rest have GPU twins in backend/cuda, tested against these functions' loops.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/routed.h"
#include "model/config.h"

namespace ds41rt::engine::v41 {

// latent[g, ch] = sum_t kv[g * ratio + t, ch] * softmax_t(gate[g * ratio + t, ch]), per channel,
// in fp32 (spec 4.4). kv, gate: [groups * ratio, hd]; latent: [groups, hd].
void compress_pool(const float *kv, const float *gate, int64_t groups, int ratio, int64_t hd, float *latent);

// Index scores of S queries at positions p0.. against T keys (spec 4.6): for each (s, t) the
// heads' relu(q . k) weighted by w and both scales, -inf where t >= (p0 + s + 1) / ratio. q:
// [S, ih, ihd]; keys: [T, ihd]; w: [S, ih]; scores: [S, T]. official: the reference's bf16 steps.
void index_scores(const float *q, const float *keys, const float *w, int64_t S, int64_t T, int64_t ih, int64_t ihd,
                  int64_t p0, int ratio, bool official, float *scores);

// Top-k with the numerics' tie rule (engine/topk.h): transformers' order, or lower index first.
std::vector<int64_t> select_top(const float *v, int64_t n, int64_t k, bool official);

// Level one of the two-level indexer at the candidate source (spec 4.7): per query, the best
// candidate_topk_blocks blocks of candidate_block_size entries (the block holding the newest
// visible entry pinned in); mask[s][t] = 1 for entries of picked blocks.
std::vector<std::vector<uint8_t>> candidate_mask(const model::model_config &c, const float *scores, int64_t S,
                                                 int64_t T, int64_t p0, int ratio, bool official);

// Level two: scores of entries outside a query's candidate blocks become -inf.
void apply_candidate_mask(const std::vector<std::vector<uint8_t>> &mask, int64_t S, int64_t T, float *scores);

// The Engram gate (spec 4.9) on the streams X [S, hc, D]: for each stream j, with key k_j and
// the shared value from kv [S, (hc + 1) * D], h += sigmoid(signed sqrt(scaled q . k)) * value.
// q, kw: [hc, D]. official: the streams are rounded to bf16.
void engram_gate(float *X, const float *kv, const float *q, const float *kw, int64_t S, int hc, int64_t D, float eps,
                 bool official);

// The router (spec 4.10) from gate logits [S, E]: sqrt(softplus(logit / temp)), top-K of score +
// bias, weights normalized over the picks and scaled by route_scale. Routes per row in pick order.
backend::cpu::route_table route(const model::model_config &c, const float *logits, const float *bias, int64_t S);

}  // namespace ds41rt::engine::v41
