// RMSNorm over rows on the GPU, the twins of backend/cpu rms_norm and rms_norm_unweighted_bf16.
//
// The model's flow has no residual-add + RMSNorm pair to fuse: with mHC the residual is four
// streams, and a sublayer's input is collapse(streams) -> norm (engine/v41_model.cpp forward),
// its output goes back through the mHC expand. So only the plain norm is here; collapse_norm.cuh
// fuses the collapse with it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// y[r, :] = w * (x[r, :] * inv_r), inv_r = 1 / sqrt(float(sum x^2 / dim) + eps), the sum in fp64
// as the CPU reference forms it (only its order differs). w may be null (unweighted); y may be x.
// round_bf16: round y to bf16 (OFFICIAL numerics' norm output). x, w, y: device pointers.
Status rms_norm_rows(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps, bool round_bf16,
                     cudaStream_t stream);

// V4's per-head q norm in bf16 arithmetic (backend/cpu rms_norm_unweighted_bf16): the fp32 sum of
// the bf16 squares is taken in channel order, as the host does, so the result is bit-exact.
// x holds bf16 values; in place. dim <= 8192.
Status rms_norm_unweighted_bf16_rows(float *x, int64_t rows, int64_t dim, float eps, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
