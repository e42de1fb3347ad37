// The gating step of V4.1's Engram (spec 4.9; engine v41_model.cpp engram()) on the GPU: each
// hyper-connection stream of each token takes in the looked-up memory's value, gated by how
// well its normalized state matches that stream's key. The hashing, table gather and the wkv
// projection come before it (other kernels).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

struct engram_gate_params {
    int64_t S = 0;  // tokens
    int hc = 0;     // streams (hc_mult, V4.1 4)
    int64_t D = 0;  // model dim (V4.1 5120)
    float eps = 0;  // rms_norm_eps (V4.1 1e-20)
    bool round_bf16 = false;  // OFFICIAL: the updated streams are bf16
};

// For token s and stream j, with h = X[s, j], k = kv[s, j * D ..], value = kv[s, hc * D ..]:
// rstd = 1 / sqrt(mean h^2 + eps) * 1 / sqrt(mean k^2 + eps) (fp64 sums, fp32 after),
// dot = float(sum_d h q_j kw_j k (fp64)) * rstd / sqrt(D), g = sigmoid(sign(dot) *
// sqrt(max(|dot|, 1e-6))), h += g * value (bf16-rounded when official). In place.
// X: [S, hc, D] fp32; kv: [S, (hc + 1) * D] fp32; q, kw: [hc, D] fp32. Graph-replayable: yes.
Status engram_gate(float *X, const float *kv, const float *q, const float *kw, const engram_gate_params &p,
                   cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
