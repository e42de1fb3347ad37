// The pooling step of a V4.1 compressor (spec 4.4; engine v41_model.cpp compress()) on the
// GPU: each complete group of `ratio` buffered tokens becomes one latent, a per-channel softmax
// over the group's gate logits weighting its kv rows. The projections before it (wkv, wgate)
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

}  // namespace ds41rt::backend::cuda
