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
//
// Records (pitch > 0): a row's codes, then its scales (and an fp8 row's bf16 tail), in one record
// of `pitch` bytes (codes, scales and tail all step by it), the form a pool's slot takes and
// attention reads through a tagged key pointer (key_record below, attention.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

struct fp8_rows {
    uint8_t *codes = nullptr;
    uint8_t *scales = nullptr;
    uint16_t *tail = nullptr;  // null when cols == stride
    int64_t pitch = 0;         // bytes from a row's codes (and scales) to the next row's; 0: dense arrays
};
struct fp4_rows {
    uint8_t *codes = nullptr;
    uint8_t *scales = nullptr;
    int64_t pitch = 0;  // as fp8_rows::pitch
};

// Packed key rows as attention reads them (attention_batch::keys): the record's address with its
// format in the low 4 bits (records are 16-byte aligned). A record holds a row of hd channels,
// codes then scales, padded to 16 bytes: V4.1's window KV (FP8 E4M3 + E8M0 per 32, 528 B at hd
// 512) and compressed entries (FP4 E2M1 + E4M3 per 16, 288 B); V4's window KV and compressed
// entries under official numerics (FP8_UE8M0_64_BF16_TAIL: FP8 + E8M0 per 64 on the first hd -
// 64 channels, then, at key_tail_offset, the last 64 (the rope dims) as bf16: 592 B at hd 512).
enum class key_format : uint32_t { F32 = 0, FP8_UE8M0_32 = 1, FP4_E4M3_16 = 2, FP8_UE8M0_64_BF16_TAIL = 3 };
constexpr int64_t KEY_BF16_TAIL = 64;  // channels of FP8_UE8M0_64_BF16_TAIL's bf16 tail
// FP8_UE8M0_64_BF16_TAIL: the tail's byte offset in the record (8-byte aligned: read 4 channels at once).
__host__ __device__ constexpr int64_t key_tail_offset(int64_t hd) {
    return ((hd - KEY_BF16_TAIL) + (hd - KEY_BF16_TAIL) / 64 + 7) / 8 * 8;
}
__host__ __device__ constexpr int64_t key_record_bytes(key_format f, int64_t hd) {
    if (f == key_format::F32) return 4 * hd;  // plain rows (hd % 4 == 0: 16-byte aligned)
    if (f == key_format::FP8_UE8M0_64_BF16_TAIL) return (key_tail_offset(hd) + 2 * KEY_BF16_TAIL + 15) / 16 * 16;
    return (f == key_format::FP8_UE8M0_32 ? hd + hd / 32 + 15 : hd / 2 + hd / 16 + 15) / 16 * 16;
}
__host__ __device__ inline const float *key_record(const uint8_t *record, key_format f) {
    return reinterpret_cast<const float *>(reinterpret_cast<uintptr_t>(record) | uintptr_t(f));
}
// Key rows as attention's lists point into them, in format fmt (fp32 rows: pitch 4 hd): row i at
// base + i * pitch, or, paged (a sequence's rows in a pool's pages, engine/cuda page_pool), at
// pages[i / page_rows] + (i % page_rows) * pitch, the table in memory the reader can dereference
// (device memory for a kernel, host memory for the host).
struct key_rows_ref {
    const uint8_t *base = nullptr;
    int64_t pitch = 0;
    key_format fmt = key_format::F32;
    const uint8_t *const *pages = nullptr;
    int64_t page_rows = 0;
    __host__ __device__ const uint8_t *row(int64_t i) const {
        return pages ? pages[i / page_rows] + (i % page_rows) * pitch : base + i * pitch;
    }
    __host__ __device__ const float *at(int64_t i) const { return key_record(row(i), fmt); }
    __host__ __device__ bool set() const { return base || pages; }
};
inline key_rows_ref f32_key_rows(const float *rows, int64_t hd) {
    return {reinterpret_cast<const uint8_t *>(rows), 4 * hd, key_format::F32};
}

// Rows of hd channels (values on the format's grid already, e.g. a window KV row after its QAT)
// each packed into its own record of format fmt (FP8_UE8M0_32, or FP8_UE8M0_64_BF16_TAIL: V4's),
// anywhere (a window ring's slots): one launch per PACK_BATCH rows, the decode step's window rows
// of every sequence at once. hd a multiple of 32 (FP8_UE8M0_32) or of 64 above 64 (the tail
// format), at most 4096.
struct row_pack {
    const float *src = nullptr;  // 16-byte aligned
    uint8_t *dst = nullptr;      // a record, 16-byte aligned
};
constexpr int PACK_BATCH = 64;
Status pack_fp8_records(const row_pack *rows, int count, int64_t hd, key_format fmt, cudaStream_t stream);
// Records of hd channels from base, in the form pack_fp8_ue8m0 / pack_fp4_e4m3 write (block 32 /
// 16; hd a multiple of it).
inline fp8_rows fp8_records(uint8_t *base, int64_t hd) {
    return {base, base + hd, nullptr, key_record_bytes(key_format::FP8_UE8M0_32, hd)};
}
inline fp8_rows fp8_tail_records(uint8_t *base, int64_t hd) {
    return {base, base + (hd - KEY_BF16_TAIL), reinterpret_cast<uint16_t *>(base + key_tail_offset(hd)),
            key_record_bytes(key_format::FP8_UE8M0_64_BF16_TAIL, hd)};
}
inline fp4_rows fp4_records(uint8_t *base, int64_t hd) {
    return {base, base + hd / 2, key_record_bytes(key_format::FP4_E4M3_16, hd)};
}

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
