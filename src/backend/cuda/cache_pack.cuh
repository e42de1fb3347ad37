// The packed cache rows of the paged pools: the same quantizers as fake_quant.cuh, stored as
// codes + scales instead of dequantized fp32, and their unpacking back to fp32 rows (what the
// attention kernels read). unpack(pack(x)) equals the fake quant of x bit for bit.
//
// Layouts (row-major, each array [rows, ...], device memory):
//  fp8 rows   codes [rows, cols] E4M3; scales [rows, cols / block] E8M0; tail [rows, stride - cols]
//             bf16 bits (the channels after cols, e.g. V4's rope dims, stored as bf16).
//             V4.1 window KV: cols = stride = 512, block 32 -> 512 + 16 = 528 B/row (spec 7).
//             V4 window KV / compressed entries: 448 of 512, block 64 -> 448 + 7 + 128 = 583 B.
//  fp4 rows   codes [rows, dim / 2] E2M1, low nibble = even channel (core e2m1_unpack);
//             scales [rows, dim / block]: E4M3 (fp4_e4m3) or E8M0 (fp4_ue8m0).
//             V4.1 compressed entry: 512, e4m3 per 16 -> 256 + 32 = 288 B; index key: 128,
//             e8m0 per 32 -> 64 + 4 = 68 B (V4's index keys: hadamard_rotate_bf16 first).
// Alignment: x 16 bytes; codes 4 bytes (fp8) / 2 bytes (fp4); block 16..128, a power of two.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

struct fp8_rows {
    uint8_t *codes = nullptr;
    uint8_t *scales = nullptr;
    uint16_t *tail = nullptr;  // null when cols == stride
};
struct fp4_rows {
    uint8_t *codes = nullptr;
    uint8_t *scales = nullptr;
};

// x [rows, stride] fp32 -> packed; the tail channels are rounded to bf16 (V4 keeps them bf16).
Status pack_fp8_ue8m0(const float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block, fp8_rows out,
                      cudaStream_t stream);
Status unpack_fp8_ue8m0(fp8_rows in, int64_t rows, int64_t stride, int64_t cols, int64_t block, float *x,
                        cudaStream_t stream);

Status pack_fp4_ue8m0(const float *x, int64_t rows, int64_t dim, int64_t block, fp4_rows out, cudaStream_t stream);
Status unpack_fp4_ue8m0(fp4_rows in, int64_t rows, int64_t dim, int64_t block, float *x, cudaStream_t stream);
Status pack_fp4_e4m3(const float *x, int64_t rows, int64_t dim, int64_t block, fp4_rows out, cudaStream_t stream);
Status unpack_fp4_e4m3(fp4_rows in, int64_t rows, int64_t dim, int64_t block, float *x, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
