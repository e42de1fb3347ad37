// Row gathers from the checkpoint's tables into fp32 rows: the token embedding (BF16
// [vocab, dim], spec V4.1 section 8 / V4 the same) and the Engram tables (F8_E4M3 rows with one
// E8M0 scale per 32 channels). Both are exact conversions, so the rows equal the CPU's bits.
// An id outside the table writes a NaN row (the kernel cannot return an error; callers check
// ids on the host where they come from, and a NaN row is loud where a clamped one would not be).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// out[s, j, :] = table[ids[s], :] for j < copies (copies = hc_mult fills the mHC streams at the
// model's entry; 1 for a plain gather). table: [vocab, dim] bf16 bits; out: [n, copies, dim].
Status embed_rows_bf16(const uint16_t *table, int64_t vocab, int64_t dim, const int32_t *ids, int64_t n, int copies,
                       float *out, cudaStream_t stream);

// out[s, :] = e4m3(table[ids[s], c]) * e8m0(scale[ids[s], c / 32]). table: [rows, dim] E4M3;
// scale: [rows, dim / 32] E8M0; out: [n, dim]. dim % 32 == 0.
Status gather_rows_fp8_e8m0(const uint8_t *table, const uint8_t *scale, int64_t table_rows, int64_t dim,
                            const int64_t *ids, int64_t n, float *out, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
