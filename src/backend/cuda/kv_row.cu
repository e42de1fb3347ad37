// kv_norm_rope_quant: one block of VEC_THREADS per row (norm_row.cuh's decode-width shape). Each
// thread normalizes its float4s with the row's RMS (rms_norm_vec_kernel's fp64 sum), rotates the
// two channel pairs of a float4 that fall in the RoPE tail (rope_kernel's pair arithmetic), then
// the block / 4 consecutive threads of a quant block agree on its max by shuffles and fake-quantize
// (fake_quant_kernel's steps, block_quant.cuh).
//
// Bytes per row: dim * 4 read and written once (+ the weight, cached); FLOPs ~20 per channel plus
// one fp64 sincos per tail pair. At V4.1 decode (dim 512, 32 pairs) a few microseconds of launch:
// the point is the two launches it saves.
//
// Test: tests/cuda/kv_row_test.cpp: bit-identical to rms_norm_rows -> rope_tail_rows ->
// fake_quant_fp8_ue8m0 (both roundings, V4.1's 512 / 32 pairs and odd shapes).
#include "backend/cuda/kv_row.cuh"

#include <string>

#include "backend/cuda/block_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_angle.cuh"

namespace ds41rt::backend::cuda {

namespace {

using namespace norm_detail;
using dev::qkind;

__global__ void __launch_bounds__(VEC_THREADS)
    kv_row_kernel(float4 *x, const float4 *__restrict__ w, int dim4, float eps, bool rb, const int64_t *pos,
                  const float *inv_freq, int n_pairs, int lanes) {
    pdl_enter();
    const int64_t row = blockIdx.x;
    float4 v[VEC_PER], g[VEC_PER];
#pragma unroll
    for (int u = 0; u < VEC_PER; u++) {
        const int i = threadIdx.x + u * VEC_THREADS;
        v[u] = i < dim4 ? x[row * dim4 + i] : make_float4(0, 0, 0, 0);
        g[u] = (w && i < dim4) ? w[i] : make_float4(1, 1, 1, 1);
    }
    const float inv = rms_inv(v, dim4, eps);
    const int first = 2 * dim4 - n_pairs;  // the first rotated pair (pair j: channels 2j, 2j + 1)
    const int64_t p = pos[row];
#pragma unroll
    for (int u = 0; u < VEC_PER; u++) {
        const int i = threadIdx.x + u * VEC_THREADS;
        float4 o = rms_out4(v[u], g[u], w != nullptr, inv, rb);
        if (i < dim4) {
            auto rotate = [&](int pj, float &a, float &b) {
                if (pj < first) return;
                float c, s;
                dev::rope_angle(p, inv_freq[pj - first], &c, &s);
                const float2 r = dev::rope_rotate(a, b, c, s);
                a = rb ? dev::round_bf16(r.x) : r.x, b = rb ? dev::round_bf16(r.y) : r.y;
            };
            rotate(2 * i, o.x, o.y);
            rotate(2 * i + 1, o.z, o.w);
        }
        const float amax = dev::block_amax(i < dim4 ? o : make_float4(0, 0, 0, 0), lanes);  // the whole warp
        if (i >= dim4) continue;
        const dev::block_scale s = dev::scale_of<qkind::FP8_UE8M0>(amax);
        o.x = dev::value_of<qkind::FP8_UE8M0>(dev::code_of<qkind::FP8_UE8M0>(o.x, s.s), s.s);
        o.y = dev::value_of<qkind::FP8_UE8M0>(dev::code_of<qkind::FP8_UE8M0>(o.y, s.s), s.s);
        o.z = dev::value_of<qkind::FP8_UE8M0>(dev::code_of<qkind::FP8_UE8M0>(o.z, s.s), s.s);
        o.w = dev::value_of<qkind::FP8_UE8M0>(dev::code_of<qkind::FP8_UE8M0>(o.w, s.s), s.s);
        x[row * dim4 + i] = o;
    }
}

}  // namespace

bool kv_row_fits(int64_t dim) { return dim > 0 && dim % 4 == 0 && dim <= int64_t(VEC_THREADS) * VEC_PER * 4; }

Status kv_norm_rope_quant(float *x, const float *w, int64_t rows, int64_t dim, float eps, bool round_bf16,
                          const int64_t *pos, const float *inv_freq, int n_pairs, int64_t block, cudaStream_t stream) {
    auto bad = [](const std::string &why) { return Status::invalid_argument("kv_norm_rope_quant: " + why); };
    if (rows < 0 || !kv_row_fits(dim))
        return bad("rows " + std::to_string(rows) + ", dim " + std::to_string(dim) + " (a multiple of 4, at most 8192)");
    if (n_pairs <= 0 || 2 * int64_t(n_pairs) > dim) return bad("n_pairs " + std::to_string(n_pairs) + " (2 * n_pairs <= dim)");
    if (block < 16 || block > 128 || (block & (block - 1)) || dim % block)
        return bad("block " + std::to_string(block) + " (16 .. 128, a power of two dividing dim " + std::to_string(dim) + ")");
    if (rows == 0) return Status::ok();
    if (!x || !pos || !inv_freq) return bad("null pointer");
    if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) & 15u) return bad("x and w must be 16-byte aligned");
    (void)launch_pdl(kv_row_kernel, unsigned(rows), VEC_THREADS, 0, stream, reinterpret_cast<float4 *>(x),
                     reinterpret_cast<const float4 *>(w), int(dim / 4), eps, round_bf16, pos, inv_freq, n_pairs,
                     int(block / 4));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
