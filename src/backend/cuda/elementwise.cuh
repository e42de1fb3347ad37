// Elementwise steps between the model's ops: the OFFICIAL numerics' bf16 rounding of an
// activation, the MoE output (routed sum + shared expert, one rounding), and the row gather /
// scatter-add / route sum of the MoE prefill paths (each expert's rows in, its outputs added back).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// x[i] = bf16(x[i]) (round to nearest even, core round_bf16). In place.
Status round_bf16_inplace(float *x, int64_t n, cudaStream_t stream);

// out[i] = a[i] + b[i] (fp32), then bf16 when round_bf16. out may be a or b.
Status add_rows(const float *a, const float *b, float *out, int64_t n, bool round_bf16, cudaStream_t stream);

// out[i, :] = x[idx[i], :] for i < n (rows of width D). idx: device int32.
Status gather_rows(const float *x, const int32_t *idx, int64_t n, int64_t D, float *out, cudaStream_t stream);

// acc[idx[i], :] += v with v = y[i, :], bf16-rounded when round_bf16, times weight[i] when weight is
// non-null (the MoE combine's steps, in that order). The idx of one call must be distinct.
Status scatter_add_rows(float *acc, const float *y, const int32_t *idx, const float *weight, int64_t n, int64_t D,
                        bool round_bf16, cudaStream_t stream);

// The MoE combine of a whole prefill in one launch: acc[t, :] = 0 + v_0 + v_1 + ... (fp32, in
// that order) over the routes pos[t, 0..K) (rows of y, -1 = none), v = y[p, :] bf16-rounded when
// round_bf16, times weight[p] when weight is non-null: the arithmetic of scatter_add_rows run
// expert by expert on a zeroed acc, when pos lists each row's routes in increasing expert id.
Status sum_routes(float *acc, const float *y, const int32_t *pos, const float *weight, int64_t S, int K, int64_t D,
                  bool round_bf16, cudaStream_t stream);

// Many small copies in one launch (a decode step's rows joining each sequence's buffers): dst[i]
// = src[i] for n floats, per copy. Copies must not overlap one another. Launches one kernel per
// COPY_BATCH copies; a copy of n = 0 is skipped.
struct float_copy {
    const float *src = nullptr;
    float *dst = nullptr;
    int64_t n = 0;
};
constexpr int COPY_BATCH = 64;
Status copy_floats(const float_copy *copies, int count, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
