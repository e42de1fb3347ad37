// Sparse attention rows on the GPU, the twin of engine/attention_row (shared by V4 and V4.1):
// K = V (one latent head), a per-head sink in the softmax denominator only, null keys skipped.
// TRANSFORMERS: one softmax over every score and the sink, P.V summed in fp64. OFFICIAL: the
// reference kernel's online softmax over blocks of 64 list entries, bf16 probabilities for P.V,
// the sink joining the denominator last, bf16 output.
#pragma once
#include <cuda_runtime.h>
#include "core/status.h"
namespace ds41rt::backend::cuda {
// R query rows x H heads; row r's key list keys[r * L .. r * L + L) (device pointers to rows of
// hd fp32 values, or null) serves all of its heads. q, out: [R, H, hd]; sink: [H].
struct attention_batch {
    const float *q = nullptr;
    const float *const *keys = nullptr;
    const float *sink = nullptr;
    float scale = 0;
    int R = 0, H = 0, L = 0, hd = 0;
    bool official = false;
    float *out = nullptr;
};
Status run_attention(const attention_batch &b, cudaStream_t stream);
}
