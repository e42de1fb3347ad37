#include "backend/cuda/rope.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/numerics.cuh"
#include "backend/cuda/rope_angle.cuh"

namespace ds41rt::backend::cuda {

namespace {

// Bytes per call: n * n_pairs * 8 written (+ n * 8 positions). One fp64 sincos per element.
__global__ void rope_tables_kernel(const int64_t *pos, int64_t n, const float *inv_freq, int n_pairs, float *cos,
                                   float *sin) {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n * n_pairs) return;
    const int64_t r = t / n_pairs;
    const int i = int(t % n_pairs);
    dev::rope_angle(pos[r], inv_freq[i], cos + t, sin + t);
}

// One thread per channel pair it touches: the tail pairs, plus the head pairs when the row is
// rounded to bf16. Bytes per call: rows * 2 * n_pairs * 8 (or rows * dim * 8 with rounding).
// The products and the sum are rounded separately (no FMA), as the host computes them.
__global__ void rope_kernel(float *x, int64_t rows, int64_t dim, const int64_t *pos, int64_t rows_per_pos,
                            const float *inv_freq, int n_pairs, bool inverse, bool rb) {
    pdl_enter();
    const int64_t half = dim / 2, per_row = rb ? half : n_pairs;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows * per_row) return;
    const int64_t r = t / per_row;
    const int64_t pj = t % per_row + (half - per_row);  // pair index within the row
    float2 *p = reinterpret_cast<float2 *>(x + r * dim) + pj;
    float2 v = *p;
    const int64_t i = pj - (half - n_pairs);
    if (i >= 0) {
        float c, s;
        dev::rope_angle(pos[r / rows_per_pos], inv_freq[i], &c, &s);
        v = dev::rope_rotate(v.x, v.y, c, inverse ? -s : s);
    }
    if (rb) {
        v.x = dev::round_bf16(v.x);
        v.y = dev::round_bf16(v.y);
    }
    *p = v;
}

constexpr int THREADS = 256;

unsigned blocks_for(int64_t n) { return unsigned((n + THREADS - 1) / THREADS); }

}  // namespace

Status rope_tables(const int64_t *pos, int64_t n, const float *inv_freq, int n_pairs, float *cos, float *sin,
                   cudaStream_t stream) {
    if (n < 0 || n_pairs <= 0) return Status::invalid_argument("rope_tables: n " + std::to_string(n) + ", n_pairs " + std::to_string(n_pairs));
    if (n == 0) return Status::ok();
    if (!pos || !inv_freq || !cos || !sin) return Status::invalid_argument("rope_tables: null pointer");
    rope_tables_kernel<<<blocks_for(n * n_pairs), THREADS, 0, stream>>>(pos, n, inv_freq, n_pairs, cos, sin);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status rope_tail_rows(float *x, int64_t rows, int64_t dim, const int64_t *pos, int64_t rows_per_pos,
                      const float *inv_freq, int n_pairs, bool inverse, bool round_bf16, cudaStream_t stream) {
    if (rows < 0 || dim <= 0 || dim % 2 != 0 || n_pairs <= 0 || 2 * int64_t(n_pairs) > dim || rows_per_pos <= 0)
        return Status::invalid_argument("rope_tail_rows: rows " + std::to_string(rows) + ", dim " + std::to_string(dim) +
                                        " (even), n_pairs " + std::to_string(n_pairs) + " (2 * n_pairs <= dim), rows_per_pos " +
                                        std::to_string(rows_per_pos));
    if (rows == 0) return Status::ok();
    if (!x || !pos || !inv_freq) return Status::invalid_argument("rope_tail_rows: null pointer");
    if (reinterpret_cast<uintptr_t>(x) % 8 != 0) return Status::invalid_argument("rope_tail_rows: x not 8-byte aligned");
    const int64_t threads = rows * (round_bf16 ? dim / 2 : n_pairs);
    (void)launch_pdl(rope_kernel, blocks_for(threads), THREADS, 0, stream, x, rows, dim, pos, rows_per_pos, inv_freq,
                     n_pairs, inverse, round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
