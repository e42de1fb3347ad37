// V4.1's Engram n-gram hashing (spec 4.9; the host's engine/engram_hash.h) on the GPU: a step's
// token ids -> every Engram layer's table row ids, with each sequence's last max_ngram - 1
// compressed token ids kept on the device, so neither the ids nor the history go through the
// host and the lookups can be part of a step's graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

constexpr int ENGRAM_MAX_NGRAM = 8;

// One row of a step: its sequence's history (int32 [max_ngram - 1], oldest first: the compressed
// ids of the max_ngram - 1 positions before the sequence's chunk of this step, -1 where the
// position lies before the sequence's start), the row's index in that chunk and the chunk's
// length. A sequence's rows are consecutive, in position order.
struct engram_hash_row {
    int32_t *hist = nullptr;
    int32_t s = 0, n = 0;
};

// What the hash of every Engram layer k reads (engram_hasher's tables, on the device):
// token_map [vocab] (a token's compressed id), mult [layers][max_ngram], primes and offsets
// [layers][max_ngram - 1][heads] (int64); table_rows [layers]: > 0 reduces each id modulo it
// (dummy weights' shortened tables), 0 keeps it.
struct engram_hash_tables {
    const int32_t *token_map = nullptr;
    const int64_t *mult = nullptr, *primes = nullptr, *offsets = nullptr, *table_rows = nullptr;
    int layers = 0, max_ngram = 0, heads = 0;
    int64_t pad = 0;  // the pad token's compressed id (blocked n-gram slots)
};

// ids [layers][S][(max_ngram - 1) * heads] (int64) for the S rows of tokens [S] (int32), exactly
// engram_hasher::hash at each row's position; then each sequence's history moves on past its
// chunk. Two launches (the history is read by all rows before any is written). Graph-replayable:
// yes (everything it reads and writes is device memory named by the arguments).
Status engram_hash(const engram_hash_tables &t, const int32_t *tokens, const engram_hash_row *rows, int S,
                   int64_t *ids, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
