// The V4.1 lightning indexer's scores on the GPU (spec 4.6 items 4-5; engine v41_model.cpp
// indexer()): for S query rows, a score per index key, summed over the indexer heads. The
// projections, RoPE and FP4 fake-quant of q and the keys come before it; the candidate mask
// (candidate_mask.cuh) and top-k (topk.cuh) after it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cache_pack.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

struct index_score_params {
    int64_t S = 0;  // query rows
    int64_t T = 0;  // index keys of the source
    int ih = 0;     // indexer heads (V4.1 32)
    int ihd = 0;    // indexer head dim (V4.1 128), even
    int64_t p0 = 0;  // position of query row 0; row s sees keys t < (p0 + s + 1) / ratio
    int ratio = 1;
    float qk_scale = 1.0f;    // ihd^-0.5
    float head_scale = 1.0f;  // ih^-0.5
    bool official = false;    // OFFICIAL's bf16 roundings; else TRANSFORMERS' fp32
};

// An index source's keys [T, ihd]: fp32 rows, or packed FP4 rows as the cache stores them
// (cache_pack.cuh fp4_rows, E2M1 codes and an E8M0 scale per 32 channels: ihd % 32 == 0), read as
// their exact values (what unpack_fp4_ue8m0 gives: the FP4 fake quant the engines apply to every
// key, so the scores are the same bits either way). Either as dense arrays or paged (a sequence's
// keys in a pool's pages, engine/cuda page_pool): key t at pages[t / page_rows] + (t % page_rows)
// * pitch (a device table), an fp32 row or an FP4 record (codes, then scales at ihd / 2).
struct index_keys {
    const float *f32 = nullptr;
    const uint8_t *codes = nullptr, *scales = nullptr;
    const uint8_t *const *pages = nullptr;
    int64_t page_rows = 0, pitch = 0;
    bool fp4 = false;  // paged keys are FP4 records
    index_keys() = default;
    index_keys(const float *k) : f32(k) {}  // NOLINT: fp32 keys convert implicitly
    index_keys(fp4_rows r) : codes(r.codes), scales(r.scales) {}  // NOLINT
    static index_keys paged(const uint8_t *const *pages, int64_t page_rows, int64_t pitch, bool fp4) {
        index_keys k;
        k.pages = pages, k.page_rows = page_rows, k.pitch = pitch, k.fp4 = fp4;
        return k;
    }
    __host__ __device__ bool packed() const { return codes || (pages && fp4); }
    bool set() const { return f32 || (codes && scales) || (pages && page_rows > 0 && pitch > 0); }
};

// scores[s, t] = sum over h (ascending) of relu(q[s, h] . k[t]) weighted by w[s, h], with the
// host's two numerics branches: TRANSFORMERS fp32 max(dot, 0) * qk_scale * (w * head_scale);
// OFFICIAL bf16(max(bf16(dot), 0) * bf16(w * (qk_scale * head_scale))) summed in fp32 and
// rounded to bf16. Each dot is cpu::dot's (fp64 sum in channel order, one rounding). -inf
// where t >= (p0 + s + 1) / ratio. q: [S, ih, ihd]; keys: [T, ihd]; w: [S, ih]; scores: [S, T].
// Graph-replayable: yes (p0 is baked per launch; a replayed decode step patches it). The first
// call per head tiling reads the device's shared-memory limit and raises the kernel's (host
// calls, no stream work); make it once before capturing a graph.
Status index_scores(const float *q, index_keys keys, const float *w, const index_score_params &p, float *scores,
                    cudaStream_t stream);

// One query row of index_scores_rows: its q [ih, ihd] and w [ih], its sequence's keys [T, ihd]
// and how many of them it sees (visible = (p0 + s + 1) / ratio for its position).
struct index_row {
    const float *q = nullptr, *w = nullptr;
    index_keys keys;
    int64_t T = 0, visible = 0;
};
constexpr int INDEX_ROWS_MAX = 16;  // rows per call (a decode step's)

// index_scores for n rows of different sequences in one launch (p's S, T, p0 and ratio unused):
// scores[i, t] for t < ld are row i's index_scores values for t < T_i (the same bits as its
// sequence's own call) and -inf from T_i on, so one topk_lower_index over [n, ld] picks for each
// row what its own call's top-k picks (padding sorts after every real key and is dropped). T_i <=
// ld, n <= INDEX_ROWS_MAX. Graph-replayable: yes (the table is a kernel parameter).
Status index_scores_rows(const index_row *rows, int n, const index_score_params &p, int64_t ld, float *scores,
                         cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
