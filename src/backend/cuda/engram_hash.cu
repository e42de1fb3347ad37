// Engram n-gram hashing on the device (engram_hash.cuh). The arithmetic is engram_hasher::hash's,
// in the same int64 operations (products of a compressed id below 2^17 and an odd multiplier
// below 2^47 stay below 2^63; XOR keeps them non-negative; % by the layer's primes): the same ids.
//
// Cost: a thread per (row, layer) walks max_ngram positions and takes (max_ngram - 1) * heads
// int64 remainders (V4.1: 4 positions, 24 remainders, ~100 instructions each): a few microseconds
// for a decode step, latency-bound; reads the step's tokens and at most max_ngram - 1 ids of
// history a row, writes 8 (max_ngram - 1) heads bytes a (row, layer). A prefill of 8192 rows:
// ~16K threads, ~50 us. The history push: a thread per row, max_ngram - 1 loads and stores.
// Test: tests/cuda_engine/engram_hash_test.cpp (the host hasher's ids, exactly).
#include "backend/cuda/engram_hash.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 128;

// The compressed id at chunk row c of the row's sequence (c <= its own index), or, before the
// chunk, history entry h (oldest first); -1: before the sequence's start.
__device__ __forceinline__ int64_t compressed_at(const engram_hash_tables &t, const int32_t *tokens, int r,
                                                 const engram_hash_row &R, int back) {
    if (back <= R.s) return t.token_map[tokens[r - back]];
    return R.hist[(t.max_ngram - 1) - (back - R.s)];
}

__global__ void __launch_bounds__(THREADS) engram_hash_kernel(const engram_hash_tables t, const int32_t *tokens,
                                                              const engram_hash_row *rows, int S, int64_t *ids) {
    pdl_enter();
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= S * t.layers) return;
    const int k = i / S, r = i - k * S;
    const engram_hash_row R = rows[r];
    const int ncols = (t.max_ngram - 1) * t.heads;
    const int64_t *mult = t.mult + size_t(k) * t.max_ngram, *primes = t.primes + size_t(k) * ncols,
                  *offsets = t.offsets + size_t(k) * ncols;
    const int64_t rows_mod = t.table_rows[k];
    int64_t *out = ids + (size_t(k) * S + r) * ncols;
    bool blocked = false;
    int64_t roll = 0;
    for (int s = 0; s < t.max_ngram; s++) {
        const int64_t src = compressed_at(t, tokens, r, R, s);
        blocked = blocked || src < 0;
        const int64_t prod = (blocked ? t.pad : src) * mult[s];
        roll = s == 0 ? prod : (roll ^ prod);
        if (s == 0) continue;
        for (int h = 0; h < t.heads; h++) {
            const int col = (s - 1) * t.heads + h;
            int64_t id = roll % primes[col] + offsets[col];
            if (rows_mod > 0) id %= rows_mod;
            out[col] = id;
        }
    }
}

// The last row of each sequence's chunk moves its history on: the compressed ids of the
// max_ngram - 1 positions ending at the chunk's last, from the chunk or the old history.
__global__ void __launch_bounds__(THREADS) engram_push_kernel(const engram_hash_tables t, const int32_t *tokens,
                                                              const engram_hash_row *rows, int S) {
    pdl_enter();
    const int r = blockIdx.x * THREADS + threadIdx.x;
    if (r >= S) return;
    const engram_hash_row R = rows[r];
    if (R.s != R.n - 1) return;
    const int H = t.max_ngram - 1;
    int32_t next[ENGRAM_MAX_NGRAM - 1];
    for (int i = 0; i < H; i++) {
        const int c = R.n - H + i;  // chunk row of entry i, negative: before the chunk
        next[i] = c >= 0 ? t.token_map[tokens[r - (R.n - 1 - c)]] : R.hist[R.n + i];
    }
    for (int i = 0; i < H; i++) R.hist[i] = next[i];
}

}  // namespace

Status engram_hash(const engram_hash_tables &t, const int32_t *tokens, const engram_hash_row *rows, int S,
                   int64_t *ids, cudaStream_t stream) {
    if (t.layers < 1 || t.max_ngram < 2 || t.max_ngram > ENGRAM_MAX_NGRAM || t.heads < 1 || S < 0)
        return Status::invalid_argument("engram_hash: layers " + std::to_string(t.layers) + " (>= 1), max_ngram " +
                                        std::to_string(t.max_ngram) + " (2.." + std::to_string(ENGRAM_MAX_NGRAM) +
                                        "), heads " + std::to_string(t.heads) + " (>= 1), rows " + std::to_string(S));
    if (S == 0) return Status::ok();
    if (!t.token_map || !t.mult || !t.primes || !t.offsets || !t.table_rows || !tokens || !rows || !ids)
        return Status::invalid_argument("engram_hash: a null table, tokens, rows or ids");
    const long threads = long(S) * t.layers;
    (void)launch_pdl(engram_hash_kernel, unsigned((threads + THREADS - 1) / THREADS), THREADS, 0, stream, t, tokens, rows,
                     S, ids);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    (void)launch_pdl(engram_push_kernel, unsigned((S + THREADS - 1) / THREADS), THREADS, 0, stream, t, tokens, rows, S);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
