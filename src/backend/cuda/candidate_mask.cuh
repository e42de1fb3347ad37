// The V4.1 indexer's level-one candidate selection on the GPU (spec 4.7; engine v41_model.cpp
// indexer() at the candidate source) and its use at the later index sources (spec 4.6 item 6).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

struct candidate_params {
    int64_t S = 0, T = 0;  // query rows, index keys
    int64_t p0 = 0;        // position of row 0; row s sees keys t < (p0 + s + 1) / ratio
    int ratio = 1;
    int block_size = 0;    // candidate_block_size (V4.1 8)
    int topk_blocks = 0;   // candidate_topk_blocks (V4.1 2048)
};

// mask[s, t] = 1 when key t lies in one of row s's selected blocks: block scores are the max of
// scores[s] over block_size keys, the block of the newest visible key is pinned to +inf, and the
// top min(topk_blocks, blocks) of them are kept (equal scores by lower block index, as
// engine::top_indices_ordered, the OFFICIAL numerics' selection) unless -inf. TRANSFORMERS
// numerics select with torch's tie order (engine::top_indices); the kernel matches it when no
// two block scores tie at the boundary. scores: [S, T] fp32 (no NaN); mask: [S, T] uint8, every
// element written. One block per row; graph-replayable: yes.
Status candidate_mask(const float *scores, const candidate_params &p, uint8_t *mask, cudaStream_t stream);

// scores[s, t] = -inf where mask[s, t] == 0 (a later index source with the same T). In place.
Status apply_candidate_mask(float *scores, const uint8_t *mask, int64_t S, int64_t T, cudaStream_t stream);

// The same for the rows of several sequences in one [n, ld] block (the engine's batched
// selection, index_scores_rows' layout): row i's own T and visible count; mask row i written on
// its first T columns, as candidate_mask writes that row. n <= CANDIDATE_ROWS_MAX, T <= ld.
struct candidate_row {
    int64_t T = 0, visible = 0;  // visible = (p0 + s + 1) / ratio for the row's position
};
constexpr int CANDIDATE_ROWS_MAX = 16;
Status candidate_mask_rows(const float *scores, int64_t ld, const candidate_row *rows, int n, int block_size,
                           int topk_blocks, uint8_t *mask, cudaStream_t stream);
// scores[i, t] = -inf where mask_i[t] == 0, t < T_i, for rows with a mask (null: left alone). In place.
struct candidate_apply_row {
    const uint8_t *mask = nullptr;
    int64_t T = 0;
};
Status apply_candidate_rows(float *scores, int64_t ld, const candidate_apply_row *rows, int n, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
