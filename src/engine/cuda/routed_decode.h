// The routed experts of a MoE layer from routes that stay on the device (backend/cuda
// moe_routed), shared by the V4.1 and V4 GPU forward passes: rows in chunks of up to 16, each
// chunk one fixed-shape run, so a decode step's MoE needs no host and can be part of a graph.
//
// Plans (one per layer and chunk row count, holding the layer's expert table on the device) are
// made on first use, which synchronises: the first step of a row count runs eagerly, so a graph
// capture finds them made. Chunks of one row count share a workspace (every local layer of a
// model has the same expert shapes, so the same workspace layout).
//
// EXL3 layers (backend/cuda exl3_routed_runner) likewise, for up to 16 rows: one workspace for
// every row count and layer.
//
// Threads: the engine's host thread.
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "backend/cuda/exl3_routed.cuh"
#include "backend/cuda/moe_routed.cuh"
#include "engine/cuda/device_model.h"

namespace ds41rt::engine::gpu {

class routed_decode {
public:
    // acc[S, D] = each row's routed-expert sum of x[S, D] (fp32, unrounded), routes ids / wts
    // [S, K] on the device (the router's output). x_split: x's GEMV split made by its producer
    // (may be empty; a single row's is read in place of the routed split, run_moe_routed).
    Status run(const device_model &m, int layer, const backend::cuda::moe_layer &moe, const float *x,
               const int32_t *ids, const float *wts, int64_t S, int K, float *acc,
               const backend::cuda::gemv_split &x_split = {});
    // The same for an EXL3 layer's experts (exl3_moe's form), S <= 16 rows.
    Status run_exl3(const device_model &m, int layer, const std::vector<backend::cuda::exl3_expert_dev> &experts,
                    const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids, const float *wts,
                    int64_t S, int K, float *acc);
    // The routes a run (eager or replayed from a graph) could not serve (an expert not held
    // here, an expert routed more often than a chunk allows), in two halves around the step's one
    // synchronisation: stage_errors() copies the workspaces' error words to pinned host memory and
    // clears them, in stream order at the step's end (no synchronisation of its own, where a
    // synchronous check cost each step a second round trip); errors() reads them once the stream
    // has passed that point.
    Status stage_errors(const device_model &m);
    Status errors() const;

    routed_decode() = default;
    ~routed_decode();
    routed_decode(const routed_decode &) = delete;
    routed_decode &operator=(const routed_decode &) = delete;

private:
    struct workspace {
        dtemp mem;
        const backend::cuda::moe_routed_plan *plan = nullptr;  // one plan of its layout (set once used)
    };
    // The staged error words: a workspace's by its row count (1 .. 16), then EXL3's.
    static constexpr int ERROR_SLOTS = 17;
    int32_t *words_ = nullptr;  // pinned: ERROR_SLOTS * MOE_ROUTED_ERROR_WORDS + EXL3_ROUTED_ERROR_WORDS
    bool staged_ = false;
    std::map<std::pair<int, int>, backend::cuda::moe_routed_plan> plans_;  // by (layer, rows)
    std::map<int, workspace> ws_;                                         // by rows
    backend::cuda::exl3_routed_runner exl3_;
};

}  // namespace ds41rt::engine::gpu
