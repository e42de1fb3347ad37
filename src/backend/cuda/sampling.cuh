// Sampling on the GPU: a batch of logits rows to token ids (and raw logprobs), so the rows never
// leave the device. Same semantics as the CPU row arithmetic (backend/cpu/sampling_math.h, which
// the serving sampler calls): grammar mask -> penalties -> greedy argmax (lowest id on ties), or
// temperature -> min_p -> top_k -> top_p -> one draw with the (seed, position) uniform.
//
// Exactness: the mask, penalties, temperature and min_p floor are the same fp32 operations (no
// fused multiply-adds), candidate sets and greedy are bit-identical, and top_k keeps the same
// tokens. Masses are exp(double) as on the CPU but summed in 2^-(63 - id_bits) fixed point (46
// fractional bits at 129,280 tokens), so sums are exact and independent of thread order: a row
// samples the same token whatever else is in the batch. The top_p cut and the draw can differ
// from the CPU's fp64 running sums only when the target lies within ~V * 2^-47 (1e-9) of the
// total mass from a boundary between two candidates.
//
// A cluster of eight 512-thread blocks per row (sm_90 distributed shared memory), each block a
// slice; the row is walked with radix selects over a unique 64-bit key (value order bits, then
// the inverted id, so ties go to the lowest id) instead of a sort, and once a filter leaves <= 512
// candidates they move to shared memory for the remaining selects. All sums across blocks are
// integers or fp64 partials taken in a fixed order, so the split changes no result.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cpu/sampling_row.h"
#include "core/status.h"

namespace ds41rt::backend::cuda {

inline constexpr int SAMPLING_MAX_TOP_LOGPROBS = 20;

// One row's request, device-resident so a captured decode step replays with this step's values.
struct sampling_row {
    cpu::row_sampling p;           // as the serving sampler derives it (serving::row_params)
    uint64_t seed = 0;
    int64_t position = 0;          // of the token in the output (0 = first generated)
    int32_t counts_begin = 0;      // this row's (token, count) pairs in sampling_batch::counts
    int32_t counts_len = 0;
    int32_t has_mask = 0;          // nonzero: apply sampling_batch::allowed row `row`
    int32_t logprobs = 0;          // nonzero: write logprob[row] (and top_logprobs entries)
    int32_t top_logprobs = 0;      // 0..20
};

struct sampling_batch {
    int B = 0, V = 0;
    const float *logits = nullptr;             // [B, ld], fp32, finite or -inf
    int64_t ld = 0;                            // row stride in floats (>= V)
    const sampling_row *rows = nullptr;        // [B]
    const cpu::token_count *counts = nullptr;  // the rows' pairs; distinct tokens within a row
    const uint32_t *allowed = nullptr;         // [B, mask_words]: bit i of word i/32 allows token i;
    int mask_words = 0;                        //   tokens >= 32 * mask_words are disallowed
    void *workspace = nullptr;                 // sampling_workspace_bytes(B, V)
    int32_t *tokens = nullptr;                 // [B] out
    float *logprob = nullptr;                  // [B] out, or null
    int32_t *top_ids = nullptr;                // [B, 20] out (entries past top_logprobs: -1), or null
    float *top_logprobs = nullptr;             // [B, 20] out, or null
};

// The penalized, masked row of every batch entry (fp32, rows padded to a multiple of 4).
size_t sampling_workspace_bytes(int B, int V);

// One launch for the whole batch; INVALID_ARGUMENT for shapes it cannot take.
Status run_sampling(const sampling_batch &b, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
