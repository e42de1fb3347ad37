// The routed experts of one MoE layer at decode: B token rows (1..16), each with K routes
// (expert id, FP32 gate weight), through MXFP4 (or NVFP4 W4A4) SwiGLU experts, summed per row in
// FP32 in increasing expert id. Matches backend/cpu routed_expert_sum (same rounding points in official
// numerics: bf16 gate / up / h / expert output, FP8 activations before each expert matmul).
//
// Routing data: the expert set of a step is known on the host when the plan is built (the
// router's top-k, B x K ids and weights, comes back to the host after the router). The plan
// groups the routes by expert on the host, so each selected expert is read once for all of its
// rows, and everything a launch needs (weight pointers, row gathers, route weights, the combine
// order) is baked into kernel parameters, as the GEMV bakes its weight pointers. run_moe_decode
// only launches kernels on a stream: capturable into a CUDA graph, and a captured graph replays
// exactly this routing. A new routing needs a new plan, then either eager launches or a fresh
// capture of the MoE segment applied to the instantiated step graph with cudaGraphExecUpdate
// (possible while the launch count stays the same; the GEMV's kernel parameters are internal to
// gemv.cu, so patching nodes one by one is not offered). A routing that stays on the device
// would need the GEMV to read its jobs from device memory (moe_decode.cu says why that is not
// done here).
//
// Ownership: the plan holds raw device pointers (weights, x, out, step buffers) owned by the
// caller, who keeps them alive while the plan or a graph captured from it can run. Plans are
// plain values, built and used on one host thread.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/device_info.h"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/nvfp4_gemv.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

constexpr int MOE_MAX_ROWS = 16;     // token rows per step (the GEMV's M limit)
constexpr int MOE_MAX_ROUTES = 128;  // routes per step, B x K (16 x 6 for V4 / V4.1)

// One routed expert on the device, MXFP4 (layout as gemv_matrix): w1, w3 [I, D], w2 [D, I].
struct moe_expert {
    const uint8_t *w1 = nullptr, *w1_scale = nullptr;
    const uint8_t *w3 = nullptr, *w3_scale = nullptr;
    const uint8_t *w2 = nullptr, *w2_scale = nullptr;
};

// One routed expert in NVFP4 W4A4 (layouts as nvfp4_matrix, bytes as published): w1 and w3
// share weight_scale_2 and input_scale (model/weights checks that at load).
struct moe_nvfp4_expert {
    const uint8_t *w1 = nullptr, *w1_scale = nullptr;
    const uint8_t *w3 = nullptr, *w3_scale = nullptr;
    const uint8_t *w2 = nullptr, *w2_scale = nullptr;
    float w13_weight_scale_2 = 0, w13_input_scale = 0;
    float w2_weight_scale_2 = 0, w2_input_scale = 0;
};

struct moe_layer {
    int D = 0, I = 0;                 // V4.1: 5120, 2304. V4: 4096, 2048
    std::vector<moe_expert> experts;  // by expert id; w1 == nullptr: not held here
    // Non-empty: the layer's experts are NVFP4 (by id, w1 == nullptr: not held), `experts` and
    // act_block are unused, and the numerics are backend/cpu nvfp4_w4a4_swiglu's (W4A4 GEMVs,
    // bf16 gate / up / silu / h, fp32 expert outputs) with the route weight as below.
    std::vector<moe_nvfp4_expert> nvfp4_experts;
    int act_block = 0;                // 0: reference numerics; 32 (V4.1) / 128 (V4): official
    float swiglu_limit = 0;           // 0: no clamp
    bool weight_after_w2 = false;     // as backend/cpu expert_numerics
};

struct moe_route {
    uint32_t expert = 0;
    float weight = 0;
};

// Device buffers of one step, sized by rows x routes only (not by the routing), so a decode
// bucket allocates them once: gathered x, gate, up, h and the expert outputs, one row per route.
struct moe_buffers {
    float *xg = nullptr;   // [R, D]
    float *gate = nullptr; // [R, I]
    float *up = nullptr;   // [R, I]
    float *h = nullptr;    // [R, I]
    float *ye = nullptr;   // [R, D]
};
size_t moe_buffer_bytes(int D, int I, int routes);
// Carves `base` (moe_buffer_bytes of device memory) into the five buffers.
moe_buffers moe_buffers_at(void *base, int D, int I, int routes);

// The launches of one step. `routing` is an opaque kernel-parameter block (slot -> row, weight;
// row -> slots in increasing expert id).
struct moe_decode_plan {
    int B = 0, R = 0, D = 0, I = 0, experts_read = 0;
    int act_block = 0;
    float swiglu_limit = 0;
    bool weight_after_w2 = false;
    const float *x = nullptr;
    float *out = nullptr;
    moe_buffers buf;
    gemv_plan up, down;            // w1 + w3 of every selected expert; w2 of every selected expert
    bool nvfp4 = false;            // NVFP4 layer: up4 / down4 instead of up / down
    nvfp4_gemv_plan up4, down4;
    size_t workspace_bytes = 0;    // the two GEMV workspaces, up's first
    size_t down_offset = 0;
    std::vector<int> slot_row;     // [R] token row of each slot (slots sorted by expert, then row)
    std::vector<uint32_t> slot_expert;
    std::vector<float> slot_weight;
    std::vector<int> row_off, row_slot;  // CSR [B + 1], [R]: each row's slots in increasing expert id
};

// x: device [B, D]; out: device [B, D] (must not alias x). routes: host, row b owns
// routes[b * K .. b * K + K). INVALID_ARGUMENT for an expert not held (named), NOT_SUPPORTED for
// shapes outside the limits above.
Result<moe_decode_plan> plan_moe_decode(const device_info &dev, const moe_layer &layer, const moe_buffers &buf,
                                        const float *x, float *out, const std::vector<moe_route> &routes, int B,
                                        int K);

// workspace: plan.workspace_bytes of device memory, zeroed before the plan's first run. Replays
// of the same plan need no zeroing (the GEMV leaves its split-K counters at zero), but the
// counters sit where the plan's layout puts them: a workspace last used by another plan must be
// zeroed again first (reset_moe_workspace, one memset on the stream).
Status run_moe_decode(const moe_decode_plan &plan, void *workspace, cudaStream_t stream);
Status reset_moe_workspace(const moe_decode_plan &plan, void *workspace, cudaStream_t stream);

// The NVFP4 experts' SwiGLU (backend/cpu nvfp4_w4a4_swiglu's rounding points: bf16 gate, up, silu
// and h) on [rows, inter] gate / up outputs, with each row's route weight on h when row_weight is
// non-null (the weight before w2), as run_moe_decode's NVFP4 mode computes it: the prefill path's
// step between its grouped w1 / w3 and w2 products (engine/cuda routed_prefill). h may be gate.
Status nvfp4_swiglu_rows(const float *gate, const float *up, const float *row_weight, float *h, int64_t rows,
                         int64_t inter, float limit, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
