// The placement planner: from the model, the checkpoint format, the coordinator GPUs and the
// workers with their memory budgets and the load targets, a Plan (dist/plan.h) that charges
// every owner of memory by name, or a refusal that says what does not fit and by how much.
//
// Rules, in order (docs/design.md section 9 explains them):
//  1. Each coordinator GPU owns a contiguous range of layers' non-expert weights and state
//     (layer count split evenly, earlier GPUs take the remainder); the embedding and vision
//     tower sit on the first GPU, the head, final norm and drafter on the last. Engram tables
//     are memory-mapped on the host unless engram_on_device.
//  2. Fixed charges first: weights other than routed experts, KV pools for `concurrency`
//     sequences of `context` tokens, workspaces, transport buffers, CUDA graphs, request-time
//     memory, the CUDA runtime, and headroom derived from those and the concurrency.
//  3. Whole routed-expert layers fill the GPUs bottom-up (layer 0 first), at full width, while
//     they fit (or up to max_local_layers): each on the GPU that runs its attention when that has
//     room (no hop between GPUs for the experts), else on the first GPU with room.
//  4. The remaining layers go to the workers at TP width `tp`: workers form groups of tp
//     consecutive workers; groups take contiguous runs of the remaining layers (as even as
//     possible, earlier groups the remainder); each rank holds its tp_slice of every layer of its
//     group, on the format's block alignment, padded to kernel_extent if one is given.
//  5. Any owner charged over its budget, or layers left with no worker, refuse the plan.
// Deterministic: the same input gives the same plan, byte for byte.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "dist/charges.h"
#include "dist/expert_bytes.h"
#include "dist/plan.h"
#include "model/config.h"

namespace ds41rt::dist {

struct worker_spec {
    std::string endpoint;     // host:port of its control channel
    int device = 0;           // CUDA device on its host, -1 = CPU backend
    uint64_t budget = 0;      // bytes it may use (device memory, or host memory for the CPU backend)
    std::string transport = "tcp";  // "tcp" | "nccl" (dist/plan.h WorkerSlot)
};

struct placement_input {
    model::model_config config;  // shapes; non-expert tensors are priced in the official storage
    expert_format format = expert_format::OFFICIAL;
    int exl3_bits = 2;           // EXL3 K (uniform over the routed experts)
    // One budget per coordinator GPU. cpu_coordinator: a single CPU-backend owner instead
    // (budget 0 = not checked) and no runtime or graph charges.
    std::vector<uint64_t> gpu_budgets;
    bool cpu_coordinator = false;
    std::vector<worker_spec> workers;
    int tp = 0;                  // 0: all workers in one TP group
    load_targets load;           // draft_tokens is set by the planner from `drafter`
    bool drafter = true;         // hold the MTP / DSpark stages (and verify their drafts)
    bool vision = true;          // hold the vision tower (V4.1)
    bool engram_on_device = false;
    int max_local_layers = -1;   // cap on local expert layers (-1: as many as fit)
    int kernel_extent = 0;       // pad each rank's slice to a multiple of this many channels (0: none)
};

// One rank's share of the remote layers of its group.
struct rank_share {
    int worker = 0;
    Slice slice;               // of the expert intermediate dimension
    int padded_width = 0;      // width stored (slice width rounded up to kernel_extent)
    uint64_t layer_bytes = 0;  // routed-expert bytes of one layer's slice
    std::vector<int> layers;   // the remote layers this rank holds
};

struct placement {
    Plan plan;
    int tp = 0;
    int draft_tokens = 0;
    uint64_t full_layer_bytes = 0;           // one layer's routed experts at full width
    std::vector<rank_share> ranks;           // one per worker, in worker order
    std::vector<int> dense_owner;            // per layer: the GPU holding its non-expert weights
    uint64_t host_mapped_bytes = 0;          // Engram tables left on the host (not in any budget)
    uint64_t kv_bytes_per_page = 0;          // growing state of one sequence per KV_PAGE_TOKENS tokens
    uint64_t kv_bytes_per_sequence = 0;      // all state of one sequence at the planned context
};

// The coordinator and worker budgets of a default H200: cudaMemGetInfo's total on the H200
// (150,109,880,320 B, measured 2026-11-30, driver 580.159.04; nvidia-smi says 143,771 MiB of
// which 616 MiB are reserved) minus 1 GiB kept back for what no plan models (other processes on
// the card, NCCL's internal buffers).
constexpr uint64_t H200_DEVICE_BYTES = 150109880320ull;
constexpr uint64_t DEFAULT_RESERVE_BYTES = 1ull << 30;
constexpr uint64_t DEFAULT_GPU_BUDGET = H200_DEVICE_BYTES - DEFAULT_RESERVE_BYTES;

// The plan, or INVALID_ARGUMENT for bad input, or OUT-of-budget refusals (INVALID_ARGUMENT too)
// whose message starts "infeasible:" and names every owner that does not fit with its shortfall.
Result<placement> place(const placement_input &in);

// Reads a checkpoint's config.json for planning (model::parse_config): the shapes and the
// routed-expert publication its quantization_config describes, with EXL3's K. Quantized releases
// keep every non-expert tensor in the official storage (quant-formats.md 0).
struct model_source {
    model::model_config config;
    expert_format format = expert_format::OFFICIAL;
    int exl3_bits = 2;
};
Result<model_source> load_model_source(const std::string &dir);
Result<model_source> builtin_model_source(const std::string &model_type);  // "deepseek_v41" | "deepseek_v4"

}  // namespace ds41rt::dist
