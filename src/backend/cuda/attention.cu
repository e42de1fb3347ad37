// A plain sparse-attention kernel: one block per (row, head), scores by thread, the softmax
// bookkeeping on one thread in list order, P.V by channel. Correct first (its engine-level
// check: docs/perf/2026-11-30-cuda-engine.md); a kernel that reads each key row once for all
// heads of a row is the decode path's next step. Bytes per (row, head): L * hd * 4 twice (scores,
// P.V) from L2; FLOPs 4 * L * hd.
#include <cfloat>
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/numerics.cuh"
namespace ds41rt::backend::cuda {
namespace {
__global__ void naive_attn(attention_batch b) {
    extern __shared__ float sm[];  // scores [L], block rescale [L/64+1], p [L]
    const int r = blockIdx.x / b.H, h = blockIdx.x % b.H;
    const float *q = b.q + (int64_t(r) * b.H + h) * b.hd;
    const float *const *keys = b.keys + int64_t(r) * b.L;
    float *sc = sm, *resc = sm + b.L, *p = resc + (b.L / 64 + 2);
    __shared__ float s_den;
    for (int i = threadIdx.x; i < b.L; i += blockDim.x) {
        const float *k = keys[i];
        if (!k) { sc[i] = -INFINITY; continue; }
        double a = 0;
        for (int d = 0; d < b.hd; d++) a += double(q[d]) * double(k[d]);
        sc[i] = __fmul_rn(float(a), b.scale);
    }
    __syncthreads();
    const float sink = b.sink[h];
    if (threadIdx.x == 0) {
        if (!b.official) {
            float mx = sink;
            for (int i = 0; i < b.L; i++) mx = fmaxf(mx, sc[i]);
            float den = expf(sink - mx);
            for (int i = 0; i < b.L; i++) { p[i] = keys[i] ? expf(sc[i] - mx) : 0.0f; den += p[i]; }
            for (int i = 0; i < b.L; i++) p[i] = p[i] / den;
            s_den = 1.0f;
        } else {
            float mx = -INFINITY, den = 0;
            int nb = 0;
            for (int b0 = 0; b0 < b.L; b0 += 64, nb++) {
                const int b1 = min(b.L, b0 + 64);
                float bmx = mx;
                for (int i = b0; i < b1; i++) if (keys[i]) bmx = fmaxf(bmx, sc[i]);
                if (bmx == -INFINITY) { resc[nb] = 1.0f; for (int i = b0; i < b1; i++) p[i] = 0; continue; }
                const float rs = expf(mx - bmx);
                float bsum = 0;
                for (int i = b0; i < b1; i++) if (keys[i]) { float e = expf(sc[i] - bmx); bsum += e; p[i] = dev::round_bf16(e); } else p[i] = 0;
                den = den * rs + bsum;
                resc[nb] = rs;
                mx = bmx;
            }
            den += expf(sink - mx);
            s_den = den;
        }
    }
    __syncthreads();
    float *out = b.out + (int64_t(r) * b.H + h) * b.hd;
    for (int d = threadIdx.x; d < b.hd; d += blockDim.x) {
        double acc = 0;
        int nb = 0;
        for (int b0 = 0; b0 < b.L; b0 += 64, nb++) {
            if (b.official) acc *= resc[nb];
            for (int i = b0; i < min(b.L, b0 + 64); i++) if (keys[i]) acc += double(p[i]) * keys[i][d];
        }
        out[d] = b.official ? dev::round_bf16(float(acc) / s_den) : float(acc);
    }
}
}
Status run_attention(const attention_batch &b, cudaStream_t s) {
    if (b.R == 0) return Status::ok();
    const size_t smem = (size_t(b.L) * 2 + b.L / 64 + 2) * sizeof(float);
    naive_attn<<<b.R * b.H, 128, smem, s>>>(b);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}
}
