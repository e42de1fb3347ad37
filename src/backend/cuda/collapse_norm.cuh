// A sublayer's input at decode widths in one launch: the hc residual streams collapsed
// (hc_collapse), RMS-normalized (rms_norm_rows) and, for official numerics, quantized as the
// GEMV's activation split (gemv_split), which the sublayer's first projections then read instead
// of splitting x themselves. Three launches fewer per sublayer than collapse -> norm -> split.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gemv.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// y[s, :] = rms_norm(sum_j pre[s, j] X[s, j, :]) with weights w (may be null), each step with
// the bits of the op it replaces (the same fp32 steps in the same order; the norm's fp64 sum as
// rms_norm_rows' decode-width kernel forms it). round_bf16: OFFICIAL's bf16 collapse and norm
// outputs. split (may be null): y quantized per act_block (32 or 128) channels into split->xs /
// split->sx in gemv_split's layout, as the GEMV's own split would, for S <= 16 rows.
// Shapes: hc 1..8; D a multiple of 4 (of act_block with a split), at most 8192; X, w, y 16-byte
// aligned; y must not alias X. Otherwise INVALID_ARGUMENT (collapse_norm_fits says beforehand).
Status hc_collapse_norm(const float *X, const float *pre, int64_t S, int hc, int64_t D, bool round_bf16, const float *w,
                        float eps, float *y, const gemv_split *split, int act_block, cudaStream_t stream);
bool collapse_norm_fits(int hc, int64_t D);
// The same without the collapse: y = rms_norm(x) (rms_norm_rows' bits; y may be x) and, with a
// split, y's GEMV split: a norm whose output only feeds official GEMVs (the q norm before wq_b).
Status rms_norm_split(const float *x, const float *w, float *y, int64_t S, int64_t D, bool round_bf16, float eps,
                      const gemv_split *split, int act_block, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
