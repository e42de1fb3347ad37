// The pooling step of a V4.1 compressor (spec 4.4; engine v41_model.cpp compress()) and of a V4
// one (spec 3.5; engine/v4_steps compress_pool, overlapping windows and the ape bias) on the
// GPU: each complete window of `ratio` buffered tokens becomes one latent, a per-channel softmax
// over the window's gate logits weighting its kv rows. The projections before it (wkv, wgate)
// and the bf16 rounding / RMSNorm after it are other kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// latent[g, ch] = sum_t kv[g * ratio + t, ch] * softmax_t(gate[g * ratio + t, ch]), in the
// host's fp32 steps: max, then the sum of exp(gate - max), then sum_t kv * (exp(gate - max) /
// den) in t order. kv, gate: [G * ratio, hd] fp32 (the buffered tokens of G complete groups);
// latent: [G, hd]. round_bf16: OFFICIAL's bf16 latent (the host's rb() after the pooling).
// Graph-replayable: yes.
Status compress_pool(const float *kv, const float *gate, int64_t G, int ratio, int64_t hd, bool round_bf16,
                     float *latent, cudaStream_t stream);

// V4's pooling (engine v4_steps compress_pool, overlapping windows): window g's slots are entries
// [first[g], first[g + 1]) of the row-pointer lists kv and gate, in the host's slot order (with
// overlap: the previous window's Ca rows, then this window's Cb rows); each pointer is the start
// of d floats (its half of a row), gate already biased by ape. latent[g, ch] = sum_i kv_i[ch] *
// (exp(gate_i[ch] - max) / sum exp), in the host's fp32 steps and order (exp as pool_kernel's).
// kv, gate, first: device arrays; latent: [G, d]. Graph-replayable: yes (the lists are data).
Status compress_pool_slots(const float *const *kv, const float *const *gate, const int32_t *first, int64_t G,
                           int64_t d, float *latent, cudaStream_t stream);

// rows[r, ch] += bias[(r % period) * width + ch] for r < R, ch < width: V4's absolute-position
// bias (ape) on the buffered gate rows of the windows about to close (they start at multiples of
// the period). Exact (one fp32 add each, as the host's +=).
Status add_periodic_bias(float *rows, int64_t R, int64_t width, const float *bias, int period, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
