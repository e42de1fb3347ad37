#include "backend/cuda/swiglu.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 256;

// Bytes per call: rows * inter * 12 (g, u read, h written); one fp64 exp per element.
__global__ void swiglu_kernel(const float *g, const float *u, const float *row_weight, float *h, int64_t rows,
                              int64_t inter, float lim, bool rb) {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows * inter) return;
    float gv = g[t], uv = u[t];
    if (lim > 0) {
        uv = fminf(fmaxf(uv, -lim), lim);
        gv = fminf(gv, lim);
    }
    const float e = float(exp(double(-gv)));
    float v = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, e)), uv);
    if (row_weight) v = __fmul_rn(row_weight[t / inter], v);
    h[t] = rb ? dev::round_bf16(v) : v;
}

}  // namespace

Status swiglu_rows(const float *g, const float *u, const float *row_weight, float *h, int64_t rows, int64_t inter,
                   float limit, bool round_bf16, cudaStream_t stream) {
    if (rows < 0 || inter <= 0 || !(limit >= 0))
        return Status::invalid_argument("swiglu_rows: rows " + std::to_string(rows) + ", inter " + std::to_string(inter) +
                                        ", limit " + std::to_string(limit) + " (>= 0)");
    if (rows == 0) return Status::ok();
    if (!g || !u || !h) return Status::invalid_argument("swiglu_rows: null g, u or h");
    const int64_t n = rows * inter;
    swiglu_kernel<<<unsigned((n + THREADS - 1) / THREADS), THREADS, 0, stream>>>(g, u, row_weight, h, rows, inter, limit,
                                                                                 round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
