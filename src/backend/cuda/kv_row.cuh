// The window KV row's steps after its projection (v41_gpu attn_qkv) in one launch: RMSNorm with
// the kv_norm weight, RoPE on the row's last 2 * n_pairs channels at the row's position, then the
// FP8 (E4M3 + E8M0) fake quant per `block` channels. Bit-identical to rms_norm_rows ->
// rope_tail_rows (one row per position, forward) -> fake_quant_fp8_ue8m0, the three launches it
// replaces at every layer of a decode step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// Whether one block holds a row (dim a multiple of 4, at most 8192): the kernel's shape.
bool kv_row_fits(int64_t dim);

// x [rows, dim] in place (16-byte aligned, as w); pos [rows] device positions; inv_freq [n_pairs]
// the engine's frequencies; round_bf16: OFFICIAL's bf16 points after the norm and the rotation;
// block: 16 .. 128, a power of two dividing dim.
Status kv_norm_rope_quant(float *x, const float *w, int64_t rows, int64_t dim, float eps, bool round_bf16,
                          const int64_t *pos, const float *inv_freq, int n_pairs, int64_t block, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
