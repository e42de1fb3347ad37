// The block fake quantizers of the caches and activations (backend/cpu ops.h) on the GPU,
// bit-exact to the CPU: quantize onto the grid and dequantize back, in place, along each row in
// blocks of `block` channels. All pointers are device pointers; x 16-byte aligned, stride and
// block multiples of 4, block / 4 a power of two <= 32 (block 16 .. 128).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// FP8 E4M3 with power-of-two scales over the first `cols` channels of rows `stride` apart (the
// rest of each row untouched): V4.1's window KV and act_quant (cols = stride), V4's nope dims.
Status fake_quant_fp8_ue8m0_cols(float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block,
                                 cudaStream_t stream);
inline Status fake_quant_fp8_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block, cudaStream_t stream) {
    return fake_quant_fp8_ue8m0_cols(x, rows, dim, dim, block, stream);
}
// FP4 E2M1 with power-of-two scales (indexer q / keys).
Status fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block, cudaStream_t stream);
// FP4 E2M1 with E4M3 scales (V4.1's compressed KV entries, block 16).
Status fake_quant_fp4_e4m3(float *x, int64_t rows, int64_t dim, int64_t block, cudaStream_t stream);

// x = bf16(dim^-0.5 * H x), H the Sylvester Walsh-Hadamard matrix, butterflies in the host's
// stage order (each stage's adds are single fp32 roundings, so the result is bit-exact). dim a
// power of two, 2 .. 1024. V4's rotate_activation.
Status hadamard_rotate_bf16(float *x, int64_t rows, int64_t dim, cudaStream_t stream);
// V4's indexer q / key quantization point: hadamard_rotate_bf16, then fake_quant_fp4_ue8m0.
Status rotate_fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block, cudaStream_t stream);

namespace detail {
// Shared argument check of the block quantizers and packers (names the op in the message).
Status check_blocks(const char *op, const void *x, int64_t rows, int64_t stride, int64_t cols, int64_t block);
}  // namespace detail

}  // namespace ds41rt::backend::cuda
