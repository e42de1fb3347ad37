// Top-k selection with the tie behaviour of the transformers oracle.
#pragma once

#include <cstdint>
#include <vector>

namespace ds41rt::engine {

// The indices of the k largest values of v[0..n), dropping picks that are -inf (entries a
// query may not see yet; transformers turns them into sentinels and drops them).
//
// Which of several EQUAL values are picked follows torch.topk on the CPU: (value, index) pairs
// in index order, std::partial_sort when k * 64 <= n, else std::nth_element, comparator
// "greater, NaN first". Exact ties are common in the indexer (relu zeros), so the selection must
// follow the oracle's algorithm, not a lowest-index rule, for fixtures to compare at all.
std::vector<int64_t> top_indices(const float *v, int64_t n, int64_t k);

// The same selection with ties broken by lower index: the picks then depend only on the values,
// not on n (how many entries exist yet), so a prefill and a token-by-token decode select alike.
// Used by the OFFICIAL numerics, whose bf16 indexer scores tie often; torch leaves ties
// unspecified there, so there is no oracle order to follow.
std::vector<int64_t> top_indices_ordered(const float *v, int64_t n, int64_t k);

}  // namespace ds41rt::engine
