// Attention key lists written on the device (the window half from the ring and the step's chunk,
// the compressed half from the indexer's picks), so the picks never travel to the host inside a
// step (backend/cuda/attention.cuh takes the lists as device arrays of key-row pointers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cache_pack.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// One sequence's rows of a step's key lists, written whole on the device (fill_key_rows): the
// window half from the ring and the chunk, nulls to `pad`, then the indexer's picks (k > 0) at
// column pad. Row s of the sequence (position p = p0 + s) sees positions [max(0, p - W + 1), p]:
// those before p0 from the ring (slot = position % W) when at or after `lo` (the ring holds every
// position of [lo, p0) and none before it that the row could see), the rest from the chunk. The
// window rows are skipped (nothing written before column pad) when ring and chunk are both null.
// The ring's base and the picks' entries may be fp32 rows or packed cache records (key_rows_ref).
struct key_row_seq {
    key_rows_ref ring;  // slot i: ring.at(i), fp32 rows or packed records
    const float *chunk = nullptr;
    int64_t p0 = 0, lo = 0;
    int64_t o = 0, n = 0;  // the sequence's rows [o, o + n) of the lists
    int64_t pad = 0;       // window columns: at least each row's window length
    const int32_t *idx = nullptr, *cnt = nullptr;  // picks [n, k], counts [n] (device int32)
    key_rows_ref entries;                          // pick e: entries.at(e), fp32 rows or packed records
    int k = 0;
};
constexpr int KEY_ROW_SEQS = 16;  // sequences per launch (kernel parameters)

// keys: [rows, L] key-row pointers. Columns past pad + k are set to null when tail is set (no host
// columns were copied in), else left as they are. W: the ring's rows; hd: floats per chunk row.
// Pointers only: the lists equal engine/cuda key_lists' host construction of them, to the bit.
Status fill_key_rows(const float **keys, int64_t L, const key_row_seq *seqs, int nseq, int64_t W, int64_t hd, bool tail,
                     cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
