// Interleaved RoPE on the tail of each row (backend/cpu rope_tail, engine/rope rope_rows) on the GPU.
//
// The frequencies are the engine's: engine::make_rope_table (rope_theta, or compress_rope_theta
// with YaRN) computes inv_freq on the host once per model, and the caller uploads those n_pairs
// floats once. cos/sin are then formed on the device from positions that live on the device, so
// a captured decode step replays with new positions and no host work, and no per-position table
// is kept (a 1M-position table would be 256 MB per frequency set). The angle is the same fp32
// product as the host's, float(pos) * inv_freq; cos/sin are evaluated in fp64 and rounded once,
// i.e. correctly rounded except within 1e-8 ulp of a tie; glibc's cosf/sinf (the host reference)
// err by at most ~0.5 ulp, so the two tables agree to the bit except rarely by 1 ulp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// cos[r, i] = cos(float(pos[r]) * inv_freq[i]), sin likewise; r < n, i < n_pairs. Device pointers.
Status rope_tables(const int64_t *pos, int64_t n, const float *inv_freq, int n_pairs, float *cos, float *sin,
                   cudaStream_t stream);

// Rotates the last 2 * n_pairs channels of each row of x [rows, dim] (pair i = channels off + 2i,
// off + 2i + 1) by the angle of position pos[r / rows_per_pos] (rows_per_pos = heads per token
// for [S, H, dim] rows; 1 for one row per token); inverse rotates by the conjugate (the attention
// output). round_bf16: then round the whole row to bf16 (OFFICIAL: the rotation is written back
// into a bf16 tensor). In place; dim even.
Status rope_tail_rows(float *x, int64_t rows, int64_t dim, const int64_t *pos, int64_t rows_per_pos,
                      const float *inv_freq, int n_pairs, bool inverse, bool round_bf16, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
