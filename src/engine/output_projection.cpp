#include "engine/output_projection.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/numerics.h"

namespace ds41rt::engine {

using backend::cpu::lin;
using backend::cpu::linear_numerics;

void grouped_output_projection(const float *o, int64_t S, int64_t heads_width, int64_t G, int64_t R, const Tensor &wo_a,
                               const Tensor &wo_b, int64_t D, bool official, int64_t act_block, float *out) {
    const int64_t gin = heads_width / G;
    std::vector<float> z(S * G * R), og(S * gin), zg(S * R);
    for (int64_t g = 0; g < G; g++) {
        for (int64_t s = 0; s < S; s++)
            std::copy(o + s * heads_width + g * gin, o + s * heads_width + (g + 1) * gin, og.data() + s * gin);
        linear_numerics(official, act_block, og.data(), wo_a.f() + g * R * gin, zg.data(), S, R, gin, lin::BF16);
        for (int64_t s = 0; s < S; s++) std::copy(zg.data() + s * R, zg.data() + (s + 1) * R, z.data() + s * G * R + g * R);
    }
    linear_numerics(official, act_block, z.data(), wo_b.f(), out, S, D, G * R, lin::FP8);
}

}  // namespace ds41rt::engine
