// Rotary tables of V4 / V4.1: which frequencies a layer uses and cos/sin at given positions.
//
// Ratio-0 layers rotate with rope_theta and no YaRN; layers with a compressed branch (ratio > 0)
// use compress_rope_theta with YaRN (no attention-factor scaling), for all their rotations.
// Angles are formed in fp32 as position * inv_freq, as the reference and transformers do.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace ds41rt::engine {

struct rope_table {
    int n_pairs = 0;
    std::vector<float> inv_freq;  // [n_pairs]

    // cos/sin for each position: out arrays [positions.size(), n_pairs].
    void eval(const int64_t *positions, int64_t n, float *cos, float *sin) const;
};

// inv_freq for rotations of 2*n_pairs channels with the given base; YaRN when yarn is set.
rope_table make_rope_table(const model::model_config &c, bool yarn);

}  // namespace ds41rt::engine

namespace ds41rt::engine {

// Rotates the last 2 * t.n_pairs channels of n rows of width dim, one position per row
// (interleaved pairs; inverse = conjugate).
void rope_rows(float *x, int64_t n, int64_t dim, const int64_t *pos, const rope_table &t, bool inverse);

}  // namespace ds41rt::engine
