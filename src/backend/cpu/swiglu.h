// One SwiGLU expert (routed or shared), shared by V4 and V4.1 (spec V4 3.9, V4.1 4.10), and by
// every place an expert runs (the engine's shared expert, the local routed layers, a worker's TP
// slice: w1, w3 [I_slice, D] and w2 [D, I_slice] give that slice's share of y):
// y = w2(weight * silu(min(w1 x, L)) * clamp(w3 x, -L, L)), the clamps only when L > 0.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "backend/cpu/numerics.h"

namespace ds41rt::backend::cpu {

struct expert_numerics {
    bool official = false;
    int64_t act_block = 32;   // OFFICIAL: FP8 activation block before the FP8/FP4 matmuls
    lin kind = lin::FP4;      // routed experts FP4, shared expert FP8
    float swiglu_limit = 0;   // 0: no clamp
    // transformers' V4 scales w2's output by the routing weight (equal in exact arithmetic);
    // the reference and V4.1 scale the SwiGLU output before w2.
    bool weight_after_w2 = false;
};

// x: [n, D]; row_weight: [n] or null (shared expert); y: [n, D]. w1, w3: [I, D]; w2: [D, I].
void swiglu_expert(const expert_numerics &nm, const Tensor &w1, const Tensor &w2, const Tensor &w3, const float *x,
                   int64_t n, int64_t D, const float *row_weight, float *y);

}  // namespace ds41rt::backend::cpu
