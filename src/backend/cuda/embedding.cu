#include "backend/cuda/embedding.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 256;

unsigned blocks_for(int64_t n) { return unsigned((n + THREADS - 1) / THREADS); }

// One thread per output element. Bytes per call: n * dim * 2 read, n * copies * dim * 4 written.
__global__ void embed_bf16_kernel(const uint16_t *table, int64_t vocab, int64_t dim, const int32_t *ids, int64_t n,
                                  int copies, float *out) {
    pdl_enter();
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n * copies * dim) return;
    const int64_t s = t / (copies * dim), c = t % dim;
    const int64_t id = ids[s];
    out[t] = (id >= 0 && id < vocab) ? dev::bf16_value(table[id * dim + c]) : __int_as_float(0x7fc00000);
}

// Bytes per call: n * dim * (1 + 1/32) read, n * dim * 4 written.
__global__ void gather_fp8_kernel(const uint8_t *table, const uint8_t *scale, int64_t rows, int64_t dim,
                                  const int64_t *ids, int64_t n, float *out) {
    pdl_enter();
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n * dim) return;
    const int64_t s = t / dim, c = t % dim, id = ids[s];
    out[t] = (id >= 0 && id < rows) ? __fmul_rn(dev::e4m3_value(table[id * dim + c]),
                                                dev::e8m0_value(scale[id * (dim / 32) + c / 32]))
                                    : __int_as_float(0x7fc00000);
}

}  // namespace

Status embed_rows_bf16(const uint16_t *table, int64_t vocab, int64_t dim, const int32_t *ids, int64_t n, int copies,
                       float *out, cudaStream_t stream) {
    if (vocab <= 0 || dim <= 0 || n < 0 || copies <= 0)
        return Status::invalid_argument("embed_rows_bf16: vocab " + std::to_string(vocab) + ", dim " + std::to_string(dim) +
                                        ", n " + std::to_string(n) + ", copies " + std::to_string(copies));
    if (n == 0) return Status::ok();
    if (!table || !ids || !out) return Status::invalid_argument("embed_rows_bf16: null pointer");
    (void)launch_pdl(embed_bf16_kernel, blocks_for(n * copies * dim), THREADS, 0, stream, table, vocab, dim, ids, n,
                     copies, out);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status gather_rows_fp8_e8m0(const uint8_t *table, const uint8_t *scale, int64_t table_rows, int64_t dim,
                            const int64_t *ids, int64_t n, float *out, cudaStream_t stream) {
    if (table_rows <= 0 || dim <= 0 || dim % 32 != 0 || n < 0)
        return Status::invalid_argument("gather_rows_fp8_e8m0: rows " + std::to_string(table_rows) + ", dim " +
                                        std::to_string(dim) + " (% 32), n " + std::to_string(n));
    if (n == 0) return Status::ok();
    if (!table || !scale || !ids || !out) return Status::invalid_argument("gather_rows_fp8_e8m0: null pointer");
    (void)launch_pdl(gather_fp8_kernel, blocks_for(n * dim), THREADS, 0, stream, table, scale, table_rows, dim, ids, n,
                     out);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
