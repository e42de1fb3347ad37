// The grouped output projection of V4 and V4.1 attention (spec V4 3.4, V4.1 4.3 step 6): the
// H heads' outputs split into o_groups groups of consecutive heads; each group maps through its
// own block of wo_a (a BF16 matmul in the reference) to o_lora_rank, the groups are concatenated
// and wo_b (FP8) maps them to the hidden size.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ds41rt::engine {

// o: [S, H * head_dim] (heads already inverse-rotated); wo_a: [G * R, H * head_dim / G] (row
// g * R + r); wo_b: [D, G * R]; out: [S, D]. official / act_block as in engine/numerics.h.
void grouped_output_projection(const float *o, int64_t S, int64_t heads_width, int64_t G, int64_t R, const Tensor &wo_a,
                               const Tensor &wo_b, int64_t D, bool official, int64_t act_block, float *out);

}  // namespace ds41rt::engine
