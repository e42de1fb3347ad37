// The routed experts of one MoE layer at decode, routed from DEVICE memory: B token rows
// (1..16) with K routes each arrive as ids [B, K] int32 and weights [B, K] fp32 in device memory
// (the router's output, never copied to the host), so a decode step runs with no host round trip
// and a CUDA graph captured once replays any routing (STYLE "routing read from device memory").
//
// Same layer description (moe_layer: MXFP4 or NVFP4 experts, numerics, clamp, weight_after_w2),
// same rounding points, expert grouping, K slicing and combine order as run_moe_decode, so for
// the same routes the output is bit-identical to it (the GEMV work-item bodies and the SwiGLU /
// combine arithmetic are the same source: gemv_kernel.cuh, nvfp4_gemv_kernel.cuh,
// moe_numerics.cuh). The oracle stays backend/cpu routed_expert_sum.
//
// Routes: an id of -1 (route_topk's dropped pick) contributes nothing. An id that is not a held
// expert of the table (out of [0, E), or w1 / w2 / w3 null) contributes nothing and sets an error
// word in the workspace, which moe_routed_error turns into INVALID_ARGUMENT naming the expert
// (call it outside the captured step, e.g. after the step's stream sync). An expert with more
// routes in one step than 8 (B <= 8) or 16 (B > 8) rows, only possible when a row repeats an
// id, zeroes the step's output and sets the error word (NOT_SUPPORTED).
//
// Ownership: the plan holds the layer's expert table in device memory (its own allocation,
// shared by copies of the plan, or caller memory of moe_routed_table_bytes(E)); weights stay
// owned by the caller. Plans are built and used on one host thread.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "backend/cuda/device_info.h"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// One row of the device expert table (both formats; the NVFP4 scalars are unused for MXFP4).
struct moe_routed_expert {
    const uint8_t *w1, *w1_scale, *w3, *w3_scale, *w2, *w2_scale;
    float w13_weight_scale_2, w13_input_scale, w2_weight_scale_2, w2_input_scale;
};

size_t moe_routed_table_bytes(int experts);

// Fixed by (layer, B, K) only. `ksplit_*[nt - 1][U]` is the K slicing plan_gemv /
// plan_nvfp4_gemv would pick for U selected experts whose largest group has 8 * nt rows or fewer;
// the device picks the entry of the step's actual U and group size.
struct moe_routed_plan {
    int B = 0, K = 0, E = 0, D = 0, I = 0;
    int u_max = 0;         // min(B * K, E): the most experts one step can select
    int nt = 1;            // token tiles of the GEMV kernels: 1 for B <= 8, else 2 (groups up to 8 * nt rows)
    int act_block = 0;
    float swiglu_limit = 0;
    bool weight_after_w2 = false, nvfp4 = false;
    const moe_routed_expert *table = nullptr;  // device [E]
    std::shared_ptr<void> owned_table;         // set when the plan allocated the table
    int ksplit_up[2][MOE_MAX_ROUTES + 1] = {}, ksplit_down[2][MOE_MAX_ROUTES + 1] = {};
    int up_blocks = 0, down_blocks = 0;  // fixed grids: the worst case over U <= u_max
    int split_blocks_up = 0;             // x split grid (per slot row)
    // Workspace layout (byte offsets), see moe_routed.cu.
    size_t off_routing = 0, off_xs_up = 0, off_sx_up = 0, off_xs_down = 0, off_sx_down = 0;
    size_t off_gate = 0, off_up = 0, off_h = 0, off_ye = 0;
    size_t off_counters_up = 0, off_counters_down = 0, off_partials_up = 0, off_partials_down = 0;
    size_t workspace_bytes = 0;
};

// Uploads the expert table (synchronously: call at load, not inside a step). table_memory:
// null (the plan allocates it) or device memory of moe_routed_table_bytes(E) that outlives the
// plan. NOT_SUPPORTED for shapes outside B <= 16, B * K <= 128, D and I multiples of 32,
// act_block 0 / 32 / 128 dividing D and I; INVALID_ARGUMENT for an empty expert table, or a
// held expert (w1, w2, w3 all set) with a missing scale, weights not 16-byte aligned, or (NVFP4)
// a scalar that is not positive and finite.
Result<moe_routed_plan> plan_moe_routed(const device_info &dev, const moe_layer &layer, int B, int K,
                                        void *table_memory = nullptr);

// x [B, D] fp32 (16-byte aligned), ids [B, K] int32, weights [B, K] fp32, out [B, D] (must not
// alias x): all device memory. workspace: plan.workspace_bytes of device memory, zeroed once
// when allocated (the GEMVs leave their split-K counters at zero; any plan's run leaves them at
// zero, but its layout is its own: zero again before a run of a plan with another layout). Plans
// with equal D, I, E, B, K, format and act_block have equal layouts (workspace_bytes and the
// offsets), so the layers of a model can share one workspace, and its error word, per B on one
// stream. Only fixed-shape
// kernel launches on `stream`: capturable into a CUDA graph; ids, weights and x may change
// between replays. x_split (may be null): x's split as its producer left it (gemv_split, e.g.
// hc_collapse_norm's, made with the plan's act_block); a plan of B = 1 in official numerics then
// reads it instead of splitting x per route (one launch fewer, the same bits), others ignore it.
Status run_moe_routed(const moe_routed_plan &plan, const float *x, const int32_t *ids, const float *weights,
                      float *out, void *workspace, cudaStream_t stream, const gemv_split *x_split = nullptr);

// Reads and clears the workspace's error word (a synchronous copy on `stream`: outside the
// captured step). OK, or INVALID_ARGUMENT naming an expert id that is not held, or NOT_SUPPORTED
// naming an expert with more than 8 * nt routes in one step.
Status moe_routed_error(const moe_routed_plan &plan, void *workspace, cudaStream_t stream);

// moe_routed_error in two halves, so a step's one synchronisation serves it: the copy of the error
// words into host_words (MOE_ROUTED_ERROR_WORDS ints, pinned memory: an asynchronous copy) and their
// clearing, stream-ordered; then, once the stream has passed them, the words' meaning.
constexpr int MOE_ROUTED_ERROR_WORDS = 4;
Status moe_routed_error_copy(const moe_routed_plan &plan, void *workspace, int32_t *host_words, cudaStream_t stream);
Status moe_routed_error_status(const moe_routed_plan &plan, const int32_t *host_words);

// Its stream-ordered twin, for a run whose answer leaves without a host synchronisation (an NCCL
// worker's status word): when the workspace's error word is set, writes fail_value to *word
// (device memory), and leaves the error word for moe_routed_error to name and clear later.
Status moe_routed_flag_error(const moe_routed_plan &plan, const void *workspace, int32_t *word, int32_t fail_value,
                             cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
