// Softmax pooling of the compressor's buffered tokens (engine v41_model.cpp compress()).
//
// Shapes: kv, gate [G * ratio, hd] fp32; latent [G, hd] fp32. One thread per (g, ch).
// Cost: reads 8 * G * ratio * hd bytes, writes 4 * G * hd; 2 * ratio fp64 exps per output.
// V4.1 decode (ratio 2, hd 512, G 1 when a group completes): 8 KB, launch-bound (~2-3 us).
// Prefill of 16384 tokens (G 8192): 67 MB read, ~16 us at the H200's ~4.3 TB/s copy rate; the
// 16 M fp64 exps (~30 fp64 ops each) take about as long, so prefill sits near both roofs.
// Numerics: the host's fp32 operations in its order, written as __f*_rn so nvcc cannot fuse a
// multiply into an add; exp is fp64 rounded once where the host calls glibc's expf (within
// ~0.5 ulp; the two differ in ~6e-4 of arguments, measured on glibc 2.36), so a latent may
// differ from the host's by an ulp or two of its terms' magnitude. No atomics; deterministic.
// Graph-replayable: yes. Test: tests/cuda/compressor_test.cpp (tolerance stated there).
#include "backend/cuda/compressor.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 256;

__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }

__global__ void pool_kernel(const float *kv, const float *gate, int64_t G, int ratio, int64_t hd, bool rb,
                            float *latent) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= G * hd) return;
    const int64_t g = i / hd, ch = i % hd;
    const float *gt = gate + g * ratio * hd + ch, *kt = kv + g * ratio * hd + ch;
    float mx = -__int_as_float(0x7f800000);
    for (int t = 0; t < ratio; t++) {
        const float x = gt[t * hd];
        mx = mx < x ? x : mx;  // std::max(mx, x)
    }
    float den = 0.0f;
    for (int t = 0; t < ratio; t++) den = __fadd_rn(den, exp_f(__fsub_rn(gt[t * hd], mx)));
    float num = 0.0f;
    for (int t = 0; t < ratio; t++) {
        const float e = __fdiv_rn(exp_f(__fsub_rn(gt[t * hd], mx)), den);
        num = __fadd_rn(num, __fmul_rn(kt[t * hd], e));
    }
    latent[i] = rb ? dev::round_bf16(num) : num;
}

// One thread per (window, channel): a warp's 32 threads read 32 consecutive channels of one slot
// row, one 128-byte line. Bytes: 8 * slots * d per window + 4 * d
// written (CSA decode: 8 slots x 512 channels, 32 KB); launch-bound at decode.
__global__ void pool_slots_kernel(const float *const *kv, const float *const *gate, const int32_t *first, int64_t G,
                                  int64_t d, float *latent) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= G * d) return;
    const int64_t g = i / d, ch = i % d;
    const int s0 = first[g], s1 = first[g + 1];
    float mx = -__int_as_float(0x7f800000);
    for (int s = s0; s < s1; s++) {
        const float x = gate[s][ch];
        mx = mx < x ? x : mx;  // std::max(mx, x)
    }
    float den = 0.0f;
    for (int s = s0; s < s1; s++) den = __fadd_rn(den, exp_f(__fsub_rn(gate[s][ch], mx)));
    float num = 0.0f;
    for (int s = s0; s < s1; s++) {
        const float e = __fdiv_rn(exp_f(__fsub_rn(gate[s][ch], mx)), den);
        num = __fadd_rn(num, __fmul_rn(kv[s][ch], e));
    }
    latent[i] = num;
}

__global__ void periodic_bias_kernel(float *rows, int64_t R, int64_t width, const float *bias, int period) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= R * width) return;
    const int64_t r = i / width, ch = i % width;
    rows[i] = __fadd_rn(rows[i], bias[(r % period) * width + ch]);
}

}  // namespace

Status compress_pool_slots(const float *const *kv, const float *const *gate, const int32_t *first, int64_t G,
                           int64_t d, float *latent, cudaStream_t stream) {
    if (G < 0 || d < 1) return Status::invalid_argument("compress_pool_slots: G " + std::to_string(G) + ", d " + std::to_string(d));
    if (G == 0) return Status::ok();
    if (!kv || !gate || !first || !latent) return Status::invalid_argument("compress_pool_slots: null argument");
    const int64_t n = G * d;
    pool_slots_kernel<<<unsigned((n + THREADS - 1) / THREADS), THREADS, 0, stream>>>(kv, gate, first, G, d, latent);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status add_periodic_bias(float *rows, int64_t R, int64_t width, const float *bias, int period, cudaStream_t stream) {
    if (R < 0 || width < 1 || period < 1)
        return Status::invalid_argument("add_periodic_bias: R " + std::to_string(R) + ", width " + std::to_string(width) +
                                        ", period " + std::to_string(period));
    if (R == 0) return Status::ok();
    if (!rows || !bias) return Status::invalid_argument("add_periodic_bias: null rows or bias");
    const int64_t n = R * width;
    periodic_bias_kernel<<<unsigned((n + THREADS - 1) / THREADS), THREADS, 0, stream>>>(rows, R, width, bias, period);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status compress_pool(const float *kv, const float *gate, int64_t G, int ratio, int64_t hd, bool round_bf16,
                     float *latent, cudaStream_t stream) {
    if (G < 0 || ratio < 1 || hd < 1)
        return Status::invalid_argument("compress_pool: G " + std::to_string(G) + ", ratio " + std::to_string(ratio) +
                                        ", hd " + std::to_string(hd));
    if (G == 0) return Status::ok();
    if (!kv || !gate || !latent) return Status::invalid_argument("compress_pool: null kv, gate or latent");
    const int64_t n = G * hd;
    pool_kernel<<<unsigned((n + THREADS - 1) / THREADS), THREADS, 0, stream>>>(kv, gate, G, ratio, hd, round_bf16,
                                                                               latent);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
