// The routed experts of a long input (a prefill chunk) from routes planned on the host, shared by
// the V4.1 and V4 GPU forward passes (routed_decode is the decode path, from routes on the
// device): in official numerics every expert's projection as one grouped GEMM on the tensor cores
// (each expert's weights read once per 128 of its rows; sm_90a), else each expert reads its weights
// once per 16 of its rows, where the decode kernels would read every selected expert once per 16
// rows of the input, and all experts' 16-row GEMV pieces share launches (device_model
// run_grouped: ~100 launches a layer at 2048 tokens, where running one expert at a time took
// ~3000 and was bound by them).
//
// Numerics: every row sums its routes in increasing expert id (backend/cuda sum_routes) with the
// rounding points of backend/cpu routed_expert_sum (bf16 expert outputs in OFFICIAL before the
// add; the route weight before w2, or after it when the layer says so), as the decode kernels do;
// only the products' fp32 summation order differs from a decode step's.
//
// Threads: the engine's host thread; everything is ordered on the model's stream.
#pragma once

#include <cstdint>

#include "backend/cpu/routed.h"
#include "backend/cuda/moe_decode.cuh"
#include "engine/cuda/device_model.h"

namespace ds41rt::engine::gpu {

// The router's device output (ids [S, K] int32, -1 = dropped pick; weights [S, K]) as a host
// route table: one synchronisation. Dropped picks are left out, as the host router leaves them.
Result<backend::cpu::route_table> routes_to_host(const device_model &m, const int32_t *ids, const float *wts, int64_t S,
                                                 int K);

// acc[S, D] = each row's routed-expert sum of x[S, D] (fp32, unrounded) over the MXFP4 or NVFP4
// experts of moe (every routed expert held). rt: S rows of at most K routes each. NVFP4 layers
// run nvfp4_gemv (W4A4, each expert's input_scale) and the publication's SwiGLU
// (backend/cuda nvfp4_swiglu_rows) and add the fp32 expert outputs unrounded, as the decode does.
Status routed_prefill(const device_model &m, const backend::cuda::moe_layer &moe, const float *x, int64_t S,
                      const backend::cpu::route_table &rt, int K, float *acc);

}  // namespace ds41rt::engine::gpu
