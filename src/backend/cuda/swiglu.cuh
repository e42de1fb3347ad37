// The clamped SwiGLU activation of an expert (backend/cpu swiglu_expert, between its w1/w3 and
// w2 products) on rows of gate and up outputs, with the optional per-row route weight.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gemv.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// h[r, i] = row_weight[r] * (silu(min(g, L)) * clamp(u, -L, L)), clamps only when limit > 0,
// the weight only when row_weight is non-null (the reference's and V4.1's order: the weight
// scales the SwiGLU output before w2); round_bf16: then round to bf16 (OFFICIAL). g, u, h:
// [rows, inter] device arrays; h may be g or u. silu(x) = x / (1 + exp(-x)) with exp evaluated
// in fp64 and rounded to fp32 (the host's expf is within ~0.5 ulp of that), the rest in the
// host's fp32 steps.
// split (official numerics, rows <= 16, act_block 32 or 128 dividing inter): also leaves h's
// GEMV split there (gemv_split), the bits run_gemv's own split of h would give, so the next
// product (the shared expert's w2) needs no split launch.
Status swiglu_rows(const float *g, const float *u, const float *row_weight, float *h, int64_t rows, int64_t inter,
                   float limit, bool round_bf16, cudaStream_t stream, const gemv_split *split = nullptr,
                   int act_block = 0);

}  // namespace ds41rt::backend::cuda
