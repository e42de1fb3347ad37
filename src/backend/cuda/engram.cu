// Engram gating (engine v41_model.cpp engram(), the loop after the wkv projection).
//
// Shapes: X [S, hc, D] fp32 (in place), kv [S, (hc + 1) D], q and kw [hc, D].
// Cost: reads X and kv and q, kw (4 (S (2 hc + 1) + 2 hc) D bytes), writes X (4 S hc D); ~8
// fp64 FLOPs per (s, j, d). V4.1 decode (S 16, hc 4, D 5120): 4.4 MB, ~1 us of HBM time; 64
// blocks: launch- and latency-bound (~3-5 us). Prefill (S 4096): ~1 GB, bandwidth-bound.
// Numerics: the host's fp32 steps in its order, without contraction (__f*_rn); its three fp64
// sums (h.h, k.k, the weighted dot) are summed in another order (strided per thread, then a
// fixed tree), which changes their fp32 roundings only in rare near-tie cases; exp is fp64
// rounded once where the host calls glibc's expf. Deterministic (fixed reduction order).
// One block per (token, stream); the sums finish before any thread writes its h. Loads are
// batched U channels a thread (same order of adds), so a call pays ~D / (THREADS U) latencies.
// Graph-replayable: yes. Test: tests/cuda/engram_test.cpp (tolerance stated there).
#include "backend/cuda/engram.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 256;  // launched with exactly this many
constexpr int U = 4;          // channels a thread loads before it adds them

__device__ double block_sum(double v, double *part) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();  // part may still be read from a previous call
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < int(blockDim.x >> 5); i++) s = __dadd_rn(s, part[i]);
    return s;
}

__global__ void engram_gate_kernel(float *X, const float *kv, const float *q, const float *kw, engram_gate_params p) {
    pdl_enter();
    __shared__ double part[THREADS / 32];
    const int64_t s = blockIdx.y, D = p.D;
    const int j = blockIdx.x;
    float *h = X + (s * p.hc + j) * D;
    const float *key = kv + s * (p.hc + 1) * D, *kj = key + j * D, *value = key + p.hc * D;
    const float *qj = q + j * D, *kwj = kw + j * D;
    double hh = 0, kk = 0, acc = 0;
    auto add = [&](double hd, double kd, float qk) {
        hh = __dadd_rn(hh, __dmul_rn(hd, hd));
        kk = __dadd_rn(kk, __dmul_rn(kd, kd));
        acc = __dadd_rn(acc, __dmul_rn(__dmul_rn(hd, double(qk)), kd));
    };
    // A thread's channels d, d + THREADS, ... in order; U of them loaded before their adds, so a
    // thread waits one memory latency per U channels (one per channel: ~12 us a call at D 5120).
    int64_t d = threadIdx.x;
    for (; d + (U - 1) * THREADS < D; d += U * THREADS) {
        float hv[U], kv_[U], qk[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            hv[u] = h[d + u * THREADS], kv_[u] = kj[d + u * THREADS];
            qk[u] = __fmul_rn(qj[d + u * THREADS], kwj[d + u * THREADS]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) add(hv[u], kv_[u], qk[u]);
    }
    for (; d < D; d += THREADS) add(h[d], kj[d], __fmul_rn(qj[d], kwj[d]));
    hh = block_sum(hh, part);
    kk = block_sum(kk, part);
    acc = block_sum(acc, part);
    const float rstd = __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(__ddiv_rn(hh, double(D))), p.eps))),
                                 __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(__ddiv_rn(kk, double(D))), p.eps))));
    const float dot = __fmul_rn(__fmul_rn(float(acc), rstd), __fdiv_rn(1.0f, __fsqrt_rn(float(D))));
    const float a = fabsf(dot);
    const float x = copysignf(__fsqrt_rn(a < 1e-6f ? 1e-6f : a), dot);
    const float g = __fdiv_rn(1.0f, __fadd_rn(1.0f, float(exp(double(-x)))));
    auto gated = [&](float hv, float vv) {
        const float v = __fadd_rn(hv, __fmul_rn(g, vv));
        return p.round_bf16 ? dev::round_bf16(v) : v;
    };
    for (d = threadIdx.x; d + (U - 1) * THREADS < D; d += U * THREADS) {
        float hv[U], vv[U];
#pragma unroll
        for (int u = 0; u < U; u++) hv[u] = h[d + u * THREADS], vv[u] = value[d + u * THREADS];
#pragma unroll
        for (int u = 0; u < U; u++) h[d + u * THREADS] = gated(hv[u], vv[u]);
    }
    for (; d < D; d += THREADS) h[d] = gated(h[d], value[d]);
}

}  // namespace

Status engram_gate(float *X, const float *kv, const float *q, const float *kw, const engram_gate_params &p,
                   cudaStream_t stream) {
    if (p.S < 0 || p.S > 65535 || p.hc < 1 || p.D < 1)
        return Status::invalid_argument("engram_gate: S " + std::to_string(p.S) + " (<= 65535), hc " +
                                        std::to_string(p.hc) + ", D " + std::to_string(p.D));
    if (p.S == 0) return Status::ok();
    if (!X || !kv || !q || !kw) return Status::invalid_argument("engram_gate: null X, kv, q or kw");
    (void)launch_pdl(engram_gate_kernel, dim3(unsigned(p.hc), unsigned(p.S)), THREADS, 0, stream, X, kv, q, kw, p);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
