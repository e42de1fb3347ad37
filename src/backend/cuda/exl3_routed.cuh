// The routed experts of one EXL3 layer at decode, routed from DEVICE memory: B token rows (1..16)
// with K routes each arrive as ids [B, K] int32 and weights [B, K] fp32 in device memory (the
// router's output, never copied to the host), so an EXL3 decode step runs with no host round trip
// and a CUDA graph captured once replays any routing. The host-routed twin is exl3_moe (any row
// count, experts grouped on the host).
//
// Numerics: exl3_moe's, step for step (OFFICIAL FP8 fake quantization of x and h, bf16 gate / up
// and h, the clamped SwiGLU with the route weight before or after w2, each row's outputs added in
// increasing expert id from zero). The products are the same exl3_gemv work items, one route per
// matrix (M = 1) instead of an expert's rows together, so an expert two rows share is decoded
// twice (~12% more trellis at B = 16, none at B = 1) and the K slicing is the one plan_exl3_gemv
// picks for B * K routes: results equal exl3_moe's up to fp32 summation order (~1e-7 relative).
//
// Routes: an id of -1 (a dropped pick) contributes nothing. An id that is not a held expert (out
// of [0, E), or no trellis) contributes nothing and sets an error word in the workspace, which
// exl3_routed_error turns into INVALID_ARGUMENT naming the expert (outside the captured step).
// A row may repeat an id: each route is its own product, summed in (expert id, pick) order.
//
// Ownership: the plan holds the layer's expert table in device memory (shared by copies of the
// plan); the weights stay owned by the caller. Plans are built and used on one host thread.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cpu/swiglu.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/exl3_moe.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

struct exl3_routed_plan {
    int B = 0, K = 0, E = 0, D = 0, I = 0;
    int act_block = 0;  // OFFICIAL's FP8 block (0: TRANSFORMERS numerics)
    float swiglu_limit = 0;
    bool weight_after_w2 = false;
    const void *table = nullptr;  // device [E] expert rows (exl3_routed.cu)
    std::shared_ptr<void> owned_table;
    int ks_up = 1, ks_down = 1, kt_up = 0, kt_down = 0;  // K slices and 16-row tiles per slice
    // Workspace layout (byte offsets), see exl3_routed.cu.
    size_t off_err = 0, off_xq = 0, off_xs_up = 0, off_gate = 0, off_xs_down = 0, off_ye = 0;
    size_t off_counters_up = 0, off_counters_down = 0, off_partials_up = 0, off_partials_down = 0;
    size_t workspace_bytes = 0;
};

// Uploads the expert table (synchronously: call at load or in an eager step, not while a graph is
// captured). nm: official, act_block, swiglu_limit, weight_after_w2 are read. NOT_SUPPORTED for
// B outside 1..16 or B * K > 128; INVALID_ARGUMENT for D or the held experts' shapes not
// multiples of 128, experts of different shapes, trellis not 4-byte aligned, K outside 1..8, an
// unknown codebook, or act_block not dividing D and I (OFFICIAL).
Result<exl3_routed_plan> plan_exl3_routed(const device_info &dev, const std::vector<exl3_expert_dev> &experts,
                                          const cpu::expert_numerics &nm, int64_t D, int B, int K);

// acc [B, D] (fp32, unrounded) = each row's routed-expert sum of x [B, D]; ids [B, K] int32 and
// weights [B, K] fp32: all device memory, acc must not alias x. workspace: plan.workspace_bytes of
// device memory, zeroed once when allocated (the GEMVs leave their split-K counters at zero).
// Plans with equal D, I, B, K, numerics and K slicing have equal layouts: the layers of a model
// can share one workspace per B on one stream. Only fixed-shape launches: capturable.
Status run_exl3_routed(const exl3_routed_plan &plan, const float *x, const int32_t *ids, const float *weights,
                       float *acc, void *workspace, cudaStream_t stream);

// Reads and clears the workspace's error word (synchronous on `stream`: outside the captured
// step): OK, or INVALID_ARGUMENT naming an expert id that is not held.
Status exl3_routed_error(const exl3_routed_plan &plan, void *workspace, cudaStream_t stream);

// exl3_routed_error in two halves (moe_routed_error_copy's pattern): the words into host_words
// (EXL3_ROUTED_ERROR_WORDS ints, pinned) and cleared, stream-ordered; their meaning once the
// stream has passed them.
constexpr int EXL3_ROUTED_ERROR_WORDS = 2;
Status exl3_routed_error_copy(const exl3_routed_plan &plan, void *workspace, int32_t *host_words, cudaStream_t stream);
Status exl3_routed_error_status(const exl3_routed_plan &plan, const int32_t *host_words);

// Its stream-ordered twin for an answer that leaves without a host synchronisation (an NCCL
// worker's status word): when the error word is set, writes fail_value to *word (device memory)
// and leaves the error word for exl3_routed_error.
Status exl3_routed_flag_error(const exl3_routed_plan &plan, const void *workspace, int32_t *word, int32_t fail_value,
                              cudaStream_t stream);

// The plans one caller runs (by layer and row count, each layer's experts fixed after its first
// run) with the workspace they share: sized by the first layer's 16-row plan, which every row
// count's layout fits in, and zeroed once. A plan is made on a layer's first run at a row count
// (a table upload, so never while `stream` is being captured: INTERNAL then). One numerics per
// runner (a plan of other numerics may need a larger workspace: INTERNAL). Host thread only.
class exl3_routed_runner {
public:
    exl3_routed_runner() = default;
    ~exl3_routed_runner();
    exl3_routed_runner(const exl3_routed_runner &) = delete;
    exl3_routed_runner &operator=(const exl3_routed_runner &) = delete;

    // run_exl3_routed for B (1..16) rows of layer `layer`.
    Status run(const device_info &dev, int layer, const std::vector<exl3_expert_dev> &experts,
               const cpu::expert_numerics &nm, int64_t D, int B, int K, const float *x, const int32_t *ids,
               const float *weights, float *acc, cudaStream_t stream);
    // exl3_routed_error / exl3_routed_flag_error on the shared workspace (OK before any run).
    Status error(cudaStream_t stream);
    // error() in halves: host_words (EXL3_ROUTED_ERROR_WORDS ints, pinned) filled in stream order
    // and read after the stream has passed them; OK when no layer ran.
    Status error_copy(int32_t *host_words, cudaStream_t stream);
    Status error_status(const int32_t *host_words) const;
    Status flag_error(int32_t *word, int32_t fail_value, cudaStream_t stream) const;

private:
    std::map<std::pair<int, int>, exl3_routed_plan> plans_;  // by (layer, rows)
    void *ws_ = nullptr;
    size_t bytes_ = 0;
    const exl3_routed_plan *any_ = nullptr;  // a plan run here: the error word's offset
};

}  // namespace ds41rt::backend::cuda
