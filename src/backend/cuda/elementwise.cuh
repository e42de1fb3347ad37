// Elementwise steps between the model's ops: the OFFICIAL numerics' bf16 rounding of an
// activation, and the MoE output (routed sum + shared expert, one rounding).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// x[i] = bf16(x[i]) (round to nearest even, core round_bf16). In place.
Status round_bf16_inplace(float *x, int64_t n, cudaStream_t stream);

// out[i] = a[i] + b[i] (fp32), then bf16 when round_bf16. out may be a or b.
Status add_rows(const float *a, const float *b, float *out, int64_t n, bool round_bf16, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
