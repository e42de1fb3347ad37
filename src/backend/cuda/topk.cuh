// Top-k per row on the GPU with ties to the lower index: engine::top_indices_ordered for each
// row of a [rows, n] fp32 array, output in its order (value descending, equal values by index
// ascending) with -inf picks dropped.
//
// Which selections it serves: the OFFICIAL numerics' indexer top-k (index_topk 512) and
// candidate blocks, and any selection without exact ties (the router's top 6 of 384 biased fp32
// scores). TRANSFORMERS numerics select with engine::top_indices, which follows torch's
// partial_sort / nth_element order among equal values (relu zeros in the indexer scores tie
// often); no GPU kernel reproduces that order, so the engine keeps those selections on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// The largest k this kernel sorts (its picks are sorted in shared memory).
constexpr int TOPK_MAX_K = 1024;

// idx[r, 0 .. count[r]) = top_indices_ordered(v + r * ld, n, k); idx[r, count[r] .. k) = -1.
// v: [rows, ld] fp32 (no NaN), n <= ld, n < 2^31; idx: [rows, k] int32; count: [rows] int32.
// 1 <= k <= TOPK_MAX_K; k > n selects all n. One block per row; no workspace; graph-replayable.
Status topk_lower_index(const float *v, int64_t rows, int64_t n, int64_t ld, int k, int32_t *idx, int32_t *count,
                        cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
