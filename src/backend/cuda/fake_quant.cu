#include "backend/cuda/fake_quant.cuh"

#include <string>

#include "backend/cuda/block_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda {

namespace {

using dev::qkind;

constexpr int THREADS = 256;

// Bytes per call: rows * cols * 8 (read and written once, float4); ~10 ops per element.
template <qkind K>
__global__ void fake_quant_kernel(float *x, int64_t rows, int64_t stride, int64_t cols, int lanes) {
    pdl_enter();
    const int64_t per_row = cols / 4;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const bool live = t < rows * per_row;
    float4 *p = live ? reinterpret_cast<float4 *>(x + (t / per_row) * stride) + t % per_row : nullptr;
    float4 v = live ? *p : make_float4(0, 0, 0, 0);
    const float amax = dev::block_amax(v, lanes);  // every lane of the warp takes part
    if (!live) return;
    const dev::block_scale s = dev::scale_of<K>(amax);
    v.x = dev::value_of<K>(dev::code_of<K>(v.x, s.s), s.s);
    v.y = dev::value_of<K>(dev::code_of<K>(v.y, s.s), s.s);
    v.z = dev::value_of<K>(dev::code_of<K>(v.z, s.s), s.s);
    v.w = dev::value_of<K>(dev::code_of<K>(v.w, s.s), s.s);
    *p = v;
}

template <qkind K>
Status launch(const char *op, float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(detail::check_blocks(op, x, rows, stride, cols, block));
    const int64_t n = rows * (cols / 4);
    if (n == 0) return Status::ok();
    (void)launch_pdl(fake_quant_kernel<K>, unsigned((n + THREADS - 1) / THREADS), THREADS, 0, stream, x, rows, stride,
                     cols, int(block / 4));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

// One block per row, one thread per channel, the row in shared memory; log2(dim) stages.
// Bytes per call: rows * dim * 8; dim * log2(dim) adds per row.
__global__ void hadamard_kernel(float *x, int dim) {
    extern __shared__ float h[];
    float *p = x + int64_t(blockIdx.x) * dim;
    const int j = threadIdx.x;
    h[j] = p[j];
    __syncthreads();
    for (int s = 1; s < dim; s <<= 1) {
        if ((j & s) == 0) {
            const float a = h[j], b = h[j + s];
            h[j] = __fadd_rn(a, b);
            h[j + s] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(float(dim)));
    p[j] = dev::round_bf16(__fmul_rn(h[j], scale));
}

}  // namespace

namespace detail {

Status check_blocks(const char *op, const void *x, int64_t rows, int64_t stride, int64_t cols, int64_t block) {
    const int64_t lanes = block / 4;
    if (rows < 0 || block <= 0 || block % 4 != 0 || lanes > 32 || (lanes & (lanes - 1)) != 0 || cols < 0 ||
        cols % block != 0 || stride < cols || stride % 4 != 0)
        return Status::invalid_argument(std::string(op) + ": rows " + std::to_string(rows) + ", stride " +
                                        std::to_string(stride) + ", cols " + std::to_string(cols) + ", block " +
                                        std::to_string(block) +
                                        " (block 16..128 a power of two, cols % block == 0, stride >= cols, stride % 4 == 0)");
    if (rows > 0 && cols > 0 && !x) return Status::invalid_argument(std::string(op) + ": null x");
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0) return Status::invalid_argument(std::string(op) + ": x not 16-byte aligned");
    return Status::ok();
}

}  // namespace detail

Status fake_quant_fp8_ue8m0_cols(float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block,
                                 cudaStream_t stream) {
    return launch<qkind::FP8_UE8M0>("fake_quant_fp8_ue8m0", x, rows, stride, cols, block, stream);
}

Status fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block, cudaStream_t stream) {
    return launch<qkind::FP4_UE8M0>("fake_quant_fp4_ue8m0", x, rows, dim, dim, block, stream);
}

Status fake_quant_fp4_e4m3(float *x, int64_t rows, int64_t dim, int64_t block, cudaStream_t stream) {
    return launch<qkind::FP4_E4M3>("fake_quant_fp4_e4m3", x, rows, dim, dim, block, stream);
}

Status hadamard_rotate_bf16(float *x, int64_t rows, int64_t dim, cudaStream_t stream) {
    if (rows < 0 || dim < 2 || dim > 1024 || (dim & (dim - 1)) != 0)
        return Status::invalid_argument("hadamard_rotate_bf16: rows " + std::to_string(rows) + ", dim " +
                                        std::to_string(dim) + " (a power of two, 2..1024)");
    if (rows == 0) return Status::ok();
    if (!x) return Status::invalid_argument("hadamard_rotate_bf16: null x");
    if (rows > 0x7fffffff) return Status::invalid_argument("hadamard_rotate_bf16: more than 2^31 rows");
    hadamard_kernel<<<unsigned(rows), unsigned(dim), size_t(dim) * sizeof(float), stream>>>(x, int(dim));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status rotate_fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(hadamard_rotate_bf16(x, rows, dim, stream));
    return fake_quant_fp4_ue8m0(x, rows, dim, block, stream);
}

}  // namespace ds41rt::backend::cuda
