// The compressed half of an attention key list, written on the device from the indexer's picks,
// so the picks never travel to the host inside a step (backend/cuda/attention.cuh takes the lists
// as device arrays of key-row pointers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// For rows r in [0, n) and j in [0, k): keys[r * L + col0 + j] = entries + idx[r * k + j] * hd
// when j < cnt[r], else nullptr (a skipped entry). idx, cnt: device int32 (topk_lower_index's
// output); keys: the rows' lists, L entries each; col0 + k <= L. Entries past cnt are never read.
Status fill_pick_keys(const float **keys, int64_t L, int64_t col0, const int32_t *idx, const int32_t *cnt, int64_t n,
                      int k, const float *entries, int64_t hd, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
