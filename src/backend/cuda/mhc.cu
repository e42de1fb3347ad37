#include "backend/cuda/mhc.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 256;
constexpr int MAX_HC = 8;

__device__ double block_sum(double v, double *part) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // part may still be read from a previous call
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < int(blockDim.x >> 5); i++) s += part[i];
    return s;
}

// One block per (output j, token s): it reads X[s] and fn[j] (flat * 8 bytes; fn stays in L2
// across tokens), so S * n_out blocks fill the GPU at decode sizes. Bytes per call: from DRAM
// S * flat * 4 + n_out * flat * 4; FLOPs 2 * S * n_out * flat (fp64) plus the squares.
__global__ void project_kernel(const float *X, int64_t flat, const float *fn, int64_t n_out, float eps, bool fold_after,
                               float *m) {
    __shared__ double part[THREADS / 32];
    const int64_t j = blockIdx.x, s = blockIdx.y;
    const float *x = X + s * flat, *w = fn + j * flat;
    double ss = 0;
    for (int64_t k = threadIdx.x; k < flat; k += blockDim.x) ss += double(x[k]) * double(x[k]);
    ss = block_sum(ss, part);
    double acc = 0;
    float out;
    if (fold_after) {
        for (int64_t k = threadIdx.x; k < flat; k += blockDim.x) acc += double(x[k]) * double(w[k]);
        acc = block_sum(acc, part);
        // cpu::dot rounds the sum of squares to fp32 before the mean (engine hc_project).
        const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(double(float(ss)) / double(flat)), eps)));
        out = __fmul_rn(float(acc), rs);
    } else {
        const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(ss / double(flat)), eps)));
        for (int64_t k = threadIdx.x; k < flat; k += blockDim.x) acc += double(__fmul_rn(x[k], inv)) * double(w[k]);
        acc = block_sum(acc, part);
        out = float(acc);
    }
    if (threadIdx.x == 0) m[s * n_out + j] = out;
}

__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-x))); }

// One thread per token; ~hc^2 * 2 * iters divisions. Bytes: S * (2 + hc) * hc * 8.
__global__ void split_kernel(const float *m, int64_t S, int hc, const float *sc, const float *b, float eps, int iters,
                             float *pre, float *post, float *comb) {
    const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (s >= S) return;
    const int64_t n_mix = int64_t(2 + hc) * hc;
    const float *ms = m + s * n_mix;
    for (int j = 0; j < hc; j++) {
        pre[s * hc + j] = __fadd_rn(sigmoid_f(__fadd_rn(__fmul_rn(ms[j], sc[0]), b[j])), eps);
        post[s * hc + j] = __fmul_rn(2.0f, sigmoid_f(__fadd_rn(__fmul_rn(ms[hc + j], sc[1]), b[hc + j])));
    }
    float C[MAX_HC * MAX_HC];
    for (int j = 0; j < hc; j++) {
        float mx = -INFINITY;
        for (int k = 0; k < hc; k++) {
            C[j * hc + k] = __fadd_rn(__fmul_rn(ms[2 * hc + j * hc + k], sc[2]), b[2 * hc + j * hc + k]);
            mx = fmaxf(mx, C[j * hc + k]);
        }
        float sum = 0;
        for (int k = 0; k < hc; k++) {
            C[j * hc + k] = exp_f(__fsub_rn(C[j * hc + k], mx));
            sum = __fadd_rn(sum, C[j * hc + k]);
        }
        for (int k = 0; k < hc; k++) C[j * hc + k] = __fadd_rn(__fdiv_rn(C[j * hc + k], sum), eps);
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < hc; j++) {  // rows
                float sum = 0;
                for (int k = 0; k < hc; k++) sum = __fadd_rn(sum, C[j * hc + k]);
                const float den = __fadd_rn(sum, eps);
                for (int k = 0; k < hc; k++) C[j * hc + k] = __fdiv_rn(C[j * hc + k], den);
            }
        for (int k = 0; k < hc; k++) {  // columns
            float sum = 0;
            for (int j = 0; j < hc; j++) sum = __fadd_rn(sum, C[j * hc + k]);
            const float den = __fadd_rn(sum, eps);
            for (int j = 0; j < hc; j++) C[j * hc + k] = __fdiv_rn(C[j * hc + k], den);
        }
    }
    for (int i = 0; i < hc * hc; i++) comb[s * hc * hc + i] = C[i];
}

// One thread per (s, d). Bytes per call: S * D * (hc + 1) * 4.
__global__ void collapse_kernel(const float *X, const float *pre, int64_t S, int hc, int64_t D, bool rb, float *x) {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= S * D) return;
    const int64_t s = t / D, d = t % D;
    float acc = 0;
    for (int j = 0; j < hc; j++) acc = __fadd_rn(acc, __fmul_rn(pre[s * hc + j], X[(s * hc + j) * D + d]));
    x[t] = rb ? dev::round_bf16(acc) : acc;
}

// One thread per (s, d) reads the hc old stream values, then writes the hc new ones (so in
// place is safe). Bytes per call: S * D * (2 hc + 1) * 4.
__global__ void expand_kernel(float *X, const float *y, const float *post, const float *comb, int64_t S, int hc,
                              int64_t D, bool rb) {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= S * D) return;
    const int64_t s = t / D, d = t % D;
    float res[MAX_HC];
    for (int j = 0; j < hc; j++) res[j] = X[(s * hc + j) * D + d];
    const float *C = comb + s * hc * hc;
    const float yv = y[t];
    for (int k = 0; k < hc; k++) {
        float acc = 0;
        for (int j = 0; j < hc; j++) acc = __fadd_rn(acc, __fmul_rn(C[j * hc + k], res[j]));
        const float v = __fadd_rn(__fmul_rn(post[s * hc + k], yv), acc);
        X[(s * hc + k) * D + d] = rb ? dev::round_bf16(v) : v;
    }
}

unsigned blocks_for(int64_t n) { return unsigned((n + THREADS - 1) / THREADS); }

Status bad(const char *op, const std::string &why) { return Status::invalid_argument(std::string(op) + ": " + why); }

}  // namespace

Status hc_project(const float *X, int64_t S, int64_t flat, const float *fn, int64_t n_out, float eps, bool fold_after,
                  float *m, cudaStream_t stream) {
    if (S < 0 || flat <= 0 || n_out <= 0 || n_out > 65535 || S > 65535)
        return bad("hc_project", "S " + std::to_string(S) + " (<= 65535), flat " + std::to_string(flat) + ", n_out " +
                                     std::to_string(n_out));
    if (S == 0) return Status::ok();
    if (!X || !fn || !m) return bad("hc_project", "null pointer");
    project_kernel<<<dim3(unsigned(n_out), unsigned(S)), THREADS, 0, stream>>>(X, flat, fn, n_out, eps, fold_after, m);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status hc_split_sinkhorn(const float *m, int64_t S, int hc, const float *scale, const float *base, float eps, int iters,
                         float *pre, float *post, float *comb, cudaStream_t stream) {
    if (S < 0 || hc <= 0 || hc > MAX_HC || iters < 1)
        return bad("hc_split_sinkhorn", "S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), iters " +
                                            std::to_string(iters) + " (>= 1)");
    if (S == 0) return Status::ok();
    if (!m || !scale || !base || !pre || !post || !comb) return bad("hc_split_sinkhorn", "null pointer");
    split_kernel<<<unsigned((S + 63) / 64), 64, 0, stream>>>(m, S, hc, scale, base, eps, iters, pre, post, comb);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status hc_collapse(const float *X, const float *pre, int64_t S, int hc, int64_t D, bool round_bf16, float *x,
                   cudaStream_t stream) {
    if (S < 0 || hc <= 0 || hc > MAX_HC || D <= 0)
        return bad("hc_collapse", "S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), D " + std::to_string(D));
    if (S == 0) return Status::ok();
    if (!X || !pre || !x) return bad("hc_collapse", "null pointer");
    collapse_kernel<<<blocks_for(S * D), THREADS, 0, stream>>>(X, pre, S, hc, D, round_bf16, x);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status hc_expand(float *X, const float *y, const float *post, const float *comb, int64_t S, int hc, int64_t D,
                 bool round_bf16, cudaStream_t stream) {
    if (S < 0 || hc <= 0 || hc > MAX_HC || D <= 0)
        return bad("hc_expand", "S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), D " + std::to_string(D));
    if (S == 0) return Status::ok();
    if (!X || !y || !post || !comb) return bad("hc_expand", "null pointer");
    expand_kernel<<<blocks_for(S * D), THREADS, 0, stream>>>(X, y, post, comb, S, hc, D, round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
