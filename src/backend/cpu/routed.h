// The routed experts of one MoE layer over a batch of rows: the sum, per row, of its routes'
// expert outputs (each already scaled by its exact FP32 gate weight), in FP32, unrounded.
//
// This is the one code path every placement runs: the coordinator's local layers with the full
// experts, and an expert worker with its TP slice of the intermediate dimension (then the sum is
// that rank's partial; the partials of all ranks add up to the full sum). Order, which the
// numerics depend on: rows are grouped by expert, experts run in increasing id, and each row's
// accumulator adds its routes' outputs in increasing expert id (what the V4 / V4.1 forward
// passes did before the experts room existed).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/swiglu.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ds41rt::backend::cpu {

struct route {
    uint32_t expert = 0;
    float weight = 0;  // the gate weight, route_scale included, exactly as the router made it
};

// The rows' routes in CSR form: row r owns routes[offsets[r] .. offsets[r + 1]).
struct route_table {
    std::vector<uint32_t> offsets;  // [rows + 1], offsets[0] = 0
    std::vector<route> routes;
    int64_t rows() const { return offsets.empty() ? 0 : int64_t(offsets.size()) - 1; }
};

// The weights of one expert (or of its TP slice). An expert with empty tensors is not held.
// NVFP4 experts (ModelOpt W4A4) also carry their activation scales: then the expert runs the
// publication's numerics (nvfp4_w4a4_expert), whatever the engine's.
struct expert_weights {
    Tensor w1, w2, w3;  // [I, D], [D, I], [I, D]
    float w13_input_scale = 0, w2_input_scale = 0;  // > 0: NVFP4 W4A4
};

// The router's [S, K] output (ids, -1 = a dropped pick; weights) as a route table, the dropped
// picks left out (as the host router leaves them).
route_table route_table_from(const int32_t *ids, const float *weights, int64_t S, int K);

// acc[rows, D] = sum over each row's routes of swiglu_expert(expert, x[row]) * weight.
// INVALID_ARGUMENT when a route names an expert outside `experts` or one not held.
Status routed_expert_sum(const expert_numerics &nm, const std::vector<expert_weights> &experts, const float *x,
                         int64_t D, const route_table &rt, float *acc);

}  // namespace ds41rt::backend::cpu
