// V4.1 and V4 MoE routing on the GPU (spec 4.10; engine v41_model.cpp moe(), v4_steps.cpp
// route()): from the gate logits to the selected experts and their weights, so the routed-expert
// launch (moe_routed) can read them on the device. The gate matmul itself is a projection (gemv);
// this starts from its output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

struct router_params {
    float gate_temp = 1.0f;
    float route_scale = 1.0f;
    bool norm_topk_prob = true;
    int n_experts = 0;  // E, 1..1024
    int k = 0;          // experts per token, 1..32, <= E
    // The normalization's denominator is sum + 1e-20 (V4.1; V4 in reference numerics) or the
    // bare sum (V4 OFFICIAL, as DeepSeek's inference code divides).
    bool eps = true;
};

// score = sqrt(softplus(logit / gate_temp)) (torch's threshold 20), picks = the k largest of
// score + bias (equal values by lower expert id), in descending order of score + bias as the
// host's top_indices returns them; weight = score / (sum of the picks' scores + 1e-20) (when
// norm_topk_prob and k > 1) * route_scale, the sum taken in pick order.
// logits: [S, E] fp32; bias: [E] fp32; ids: [S, k] int32; weights: [S, k] fp32. A -inf biased
// score (impossible for finite logits and bias) is dropped as the host drops it: id -1, weight 0.
// Graph-replayable: yes (no workspace).
Status route_topk(const float *logits, const float *bias, int64_t S, const router_params &p, int32_t *ids,
                  float *weights, cudaStream_t stream);

// V4 hash layers: the picks are tid2eid[token] (the table's k ids in table order), weighted by
// the learned gate's scores as route_topk weights its picks (same score, same normalization over
// the picks, in table order). logits: [S, E] fp32; tid2eid: [vocab, k] int32; tokens: [S] int32;
// all device memory. A token outside [0, vocab) or a table id outside [0, E) yields id -1,
// weight 0 for that pick (and the pick leaves the sum). Graph-replayable: yes.
Status route_hash(const float *logits, const int32_t *tid2eid, int64_t vocab, const int32_t *tokens, int64_t S,
                  const router_params &p, int32_t *ids, float *weights, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
