#include "backend/cuda/cache_pack.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/block_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/fake_quant.cuh"

namespace ds41rt::backend::cuda {

namespace {

using dev::qkind;

constexpr int THREADS = 256;

unsigned blocks_for(int64_t n) { return unsigned((n + THREADS - 1) / THREADS); }

// Bytes per call: rows * cols * 4 read; rows * cols (FP8) or cols / 2 (FP4) + cols / block written.
template <qkind K>
__global__ void pack_kernel(const float *x, int64_t rows, int64_t stride, int64_t cols, int lanes, uint8_t *codes,
                            uint8_t *scales, int64_t cpitch, int64_t spitch) {
    const int64_t per_row = cols / 4;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const bool live = t < rows * per_row;
    const int64_t r = live ? t / per_row : 0, c4 = live ? t % per_row : 0;
    const float4 v = live ? reinterpret_cast<const float4 *>(x + r * stride)[c4] : make_float4(0, 0, 0, 0);
    const float amax = dev::block_amax(v, lanes);
    if (!live) return;
    dev::pack_quad<K>(v, amax, c4, lanes, codes + r * cpitch, scales + r * spitch);
}

// Bytes per call: the packed bytes read, rows * cols * 4 written.
template <qkind K>
__global__ void unpack_kernel(const uint8_t *codes, const uint8_t *scales, int64_t rows, int64_t stride, int64_t cols,
                              int lanes, int64_t cpitch, int64_t spitch, float *x) {
    const int64_t per_row = cols / 4;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows * per_row) return;
    const int64_t r = t / per_row, c4 = t % per_row;
    reinterpret_cast<float4 *>(x + r * stride)[c4] = dev::unpack_quad<K>(codes + r * cpitch, scales + r * spitch, c4, lanes);
}

// pack_fp8_records: block y packs row y of the batch; thread t its channels 4t .. 4t + 3 (the
// block's threads a whole number of warps, so every lane joins block_amax's shuffles; the FP8
// channels cols are whole blocks, so no block's lanes mix with the tail's). Bytes: 4 hd read, cols
// + cols / block + 2 (hd - cols) written per row: launch-latency bound at decode sizes.
struct pack_batch {
    row_pack r[PACK_BATCH];
};
__global__ void pack_records_kernel(const __grid_constant__ pack_batch b, int64_t hd, int64_t cols, int lanes,
                                    int64_t tail_off) {
    const row_pack &j = b.r[blockIdx.x];
    const int64_t c4 = threadIdx.x;
    const bool live = c4 < hd / 4;
    const float4 v = live ? reinterpret_cast<const float4 *>(j.src)[c4] : make_float4(0, 0, 0, 0);
    const float amax = dev::block_amax(v, lanes);
    if (!live) return;
    if (4 * c4 < cols) {
        dev::pack_quad<qkind::FP8_UE8M0>(v, amax, c4, lanes, j.dst, j.dst + cols);
    } else {
        uint16_t *t = reinterpret_cast<uint16_t *>(j.dst + tail_off) + (4 * c4 - cols);
        t[0] = dev::bf16_bits(v.x), t[1] = dev::bf16_bits(v.y), t[2] = dev::bf16_bits(v.z), t[3] = dev::bf16_bits(v.w);
    }
}

// The channels after cols: bf16 bits, [rows, stride - cols] or, in records, pitch bytes a row.
// Bytes: rows * (stride - cols) * 6.
__global__ void tail_kernel(const float *x, uint16_t *tail, int64_t rows, int64_t stride, int64_t cols, int64_t pitch,
                            bool pack, float *out) {
    const int64_t w = stride - cols;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows * w) return;
    const int64_t r = t / w, c = t % w;
    uint16_t *at = pitch ? reinterpret_cast<uint16_t *>(reinterpret_cast<uint8_t *>(tail) + r * pitch) + c : tail + t;
    if (pack) *at = dev::bf16_bits(x[r * stride + cols + c]);
    else out[r * stride + cols + c] = dev::bf16_value(*at);
}

Status check_codes(const char *op, const void *codes, const void *scales, int64_t rows, int64_t cols, size_t align) {
    if (rows > 0 && cols > 0 && (!codes || !scales)) return Status::invalid_argument(std::string(op) + ": null codes or scales");
    if (reinterpret_cast<uintptr_t>(codes) % align != 0)
        return Status::invalid_argument(std::string(op) + ": codes not " + std::to_string(align) + "-byte aligned");
    return Status::ok();
}

// A row's code and scale pitches: dense arrays, or records of `pitch` bytes (which must hold the
// row and keep its codes aligned).
struct pitches {
    int64_t codes, scales;
};
template <qkind K>
Status pitches_of(const char *op, int64_t cols, int64_t block, int64_t pitch, pitches &p) {
    const int64_t code_bytes = K == qkind::FP8_UE8M0 ? cols : cols / 2;
    p = pitch == 0 ? pitches{code_bytes, cols / block} : pitches{pitch, pitch};
    if (pitch != 0 && (pitch < code_bytes + cols / block || pitch % (K == qkind::FP8_UE8M0 ? 4 : 2) != 0))
        return Status::invalid_argument(std::string(op) + ": record pitch " + std::to_string(pitch) + " does not hold a row of " +
                                        std::to_string(cols) + " channels aligned");
    return Status::ok();
}

template <qkind K>
Status pack(const char *op, const float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block, uint8_t *codes,
            uint8_t *scales, int64_t pitch, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(detail::check_blocks(op, x, rows, stride, cols, block));
    DS41RT_RETURN_IF_ERROR(check_codes(op, codes, scales, rows, cols, K == qkind::FP8_UE8M0 ? 4 : 2));
    pitches p;
    DS41RT_RETURN_IF_ERROR(pitches_of<K>(op, cols, block, pitch, p));
    const int64_t n = rows * (cols / 4);
    if (n == 0) return Status::ok();
    pack_kernel<K><<<blocks_for(n), THREADS, 0, stream>>>(x, rows, stride, cols, int(block / 4), codes, scales, p.codes,
                                                          p.scales);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

template <qkind K>
Status unpack(const char *op, const uint8_t *codes, const uint8_t *scales, int64_t rows, int64_t stride, int64_t cols,
              int64_t block, int64_t pitch, float *x, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(detail::check_blocks(op, x, rows, stride, cols, block));
    DS41RT_RETURN_IF_ERROR(check_codes(op, codes, scales, rows, cols, K == qkind::FP8_UE8M0 ? 4 : 2));
    pitches p;
    DS41RT_RETURN_IF_ERROR(pitches_of<K>(op, cols, block, pitch, p));
    const int64_t n = rows * (cols / 4);
    if (n == 0) return Status::ok();
    unpack_kernel<K><<<blocks_for(n), THREADS, 0, stream>>>(codes, scales, rows, stride, cols, int(block / 4), p.codes,
                                                            p.scales, x);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

// The tail array's place: present when stride > cols; in a record, after the codes and scales and
// inside the pitch.
Status check_tail(const char *op, const fp8_rows &r, int64_t rows, int64_t stride, int64_t cols, int64_t block) {
    if (rows == 0 || stride == cols) return Status::ok();
    if (!r.tail) return Status::invalid_argument(std::string(op) + ": stride > cols needs a tail array");
    const int64_t off = reinterpret_cast<const uint8_t *>(r.tail) - r.codes;
    if (r.pitch && (reinterpret_cast<uintptr_t>(r.tail) % 2 || off < cols + (block > 0 ? cols / block : 0) || off + 2 * (stride - cols) > r.pitch))
        return Status::invalid_argument(std::string(op) + ": the tail at byte " + std::to_string(off) + " of a " +
                                        std::to_string(r.pitch) + "-byte record does not fit after the codes");
    return Status::ok();
}

Status tail(const float *x, uint16_t *t, int64_t rows, int64_t stride, int64_t cols, int64_t pitch, bool packing, float *out,
            cudaStream_t stream) {
    const int64_t n = rows * (stride - cols);
    if (n == 0) return Status::ok();
    tail_kernel<<<blocks_for(n), THREADS, 0, stream>>>(x, t, rows, stride, cols, pitch, packing, out);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace

Status pack_fp8_records(const row_pack *rows, int count, int64_t hd, key_format fmt, cudaStream_t stream) {
    if (count == 0) return Status::ok();
    const bool tailed = fmt == key_format::FP8_UE8M0_64_BF16_TAIL;
    if (!tailed && fmt != key_format::FP8_UE8M0_32)
        return Status::invalid_argument("pack_fp8_records: not an FP8 record format");
    if (hd <= 0 || hd > 4096 || (tailed ? hd <= KEY_BF16_TAIL || (hd - KEY_BF16_TAIL) % 64 != 0 : hd % 32 != 0))
        return Status::invalid_argument("pack_fp8_records: hd must be a multiple of 32 up to 4096 (a multiple of 64 above "
                                        "64 with the bf16 tail), got " + std::to_string(hd));
    const int64_t cols = tailed ? hd - KEY_BF16_TAIL : hd;
    if (count < 0 || (count > 0 && !rows)) return Status::invalid_argument("pack_fp8_records: bad row list");
    for (int i0 = 0; i0 < count; i0 += PACK_BATCH) {
        pack_batch b{};
        const int k = std::min(PACK_BATCH, count - i0);
        for (int i = 0; i < k; i++) {
            const row_pack &r = rows[i0 + i];
            if (!r.src || !r.dst || reinterpret_cast<uintptr_t>(r.src) % 16 || reinterpret_cast<uintptr_t>(r.dst) % 16)
                return Status::invalid_argument("pack_fp8_records: row " + std::to_string(i0 + i) +
                                                " has a null or misaligned pointer");
            b.r[i] = r;
        }
        pack_records_kernel<<<unsigned(k), unsigned((hd / 4 + 31) / 32 * 32), 0, stream>>>(b, hd, cols, tailed ? 16 : 8,
                                                                                           key_tail_offset(hd));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    return Status::ok();
}

Status pack_fp8_ue8m0(const float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block, fp8_rows out,
                      cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(check_tail("pack_fp8_ue8m0", out, rows, stride, cols, block));
    DS41RT_RETURN_IF_ERROR(pack<qkind::FP8_UE8M0>("pack_fp8_ue8m0", x, rows, stride, cols, block, out.codes, out.scales, out.pitch, stream));
    return tail(x, out.tail, rows, stride, cols, out.pitch, true, nullptr, stream);
}

Status unpack_fp8_ue8m0(fp8_rows in, int64_t rows, int64_t stride, int64_t cols, int64_t block, float *x,
                        cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(check_tail("unpack_fp8_ue8m0", in, rows, stride, cols, block));
    DS41RT_RETURN_IF_ERROR(unpack<qkind::FP8_UE8M0>("unpack_fp8_ue8m0", in.codes, in.scales, rows, stride, cols, block, in.pitch, x, stream));
    return tail(nullptr, in.tail, rows, stride, cols, in.pitch, false, x, stream);
}

Status pack_fp4_ue8m0(const float *x, int64_t rows, int64_t dim, int64_t block, fp4_rows out, cudaStream_t stream) {
    return pack<qkind::FP4_UE8M0>("pack_fp4_ue8m0", x, rows, dim, dim, block, out.codes, out.scales, out.pitch, stream);
}

Status unpack_fp4_ue8m0(fp4_rows in, int64_t rows, int64_t dim, int64_t block, float *x, cudaStream_t stream) {
    return unpack<qkind::FP4_UE8M0>("unpack_fp4_ue8m0", in.codes, in.scales, rows, dim, dim, block, in.pitch, x, stream);
}

Status pack_fp4_e4m3(const float *x, int64_t rows, int64_t dim, int64_t block, fp4_rows out, cudaStream_t stream) {
    return pack<qkind::FP4_E4M3>("pack_fp4_e4m3", x, rows, dim, dim, block, out.codes, out.scales, out.pitch, stream);
}

Status unpack_fp4_e4m3(fp4_rows in, int64_t rows, int64_t dim, int64_t block, float *x, cudaStream_t stream) {
    return unpack<qkind::FP4_E4M3>("unpack_fp4_e4m3", in.codes, in.scales, rows, dim, dim, block, in.pitch, x, stream);
}

}  // namespace ds41rt::backend::cuda
