// V4.1 MoE routing on the GPU (spec 4.10; engine v41_model.cpp moe()): from the gate logits to
// the selected experts and their weights, so the routed-expert launch can read them on the
// device. The gate matmul itself is a projection (gemv); this starts from its output.
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

}  // namespace ds41rt::backend::cuda
