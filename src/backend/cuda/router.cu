// V4.1 / V4 routing from gate logits: sqrt-softplus scores, top-k of the biased scores with
// lower-index ties (or V4's hash table picks), normalized and scaled weights (engine
// v41_model.cpp moe(), v4_steps.cpp route(), spec 4.10).
//
// Shapes: logits [S, E] fp32, bias [E], ids [S, k] int32, weights [S, k] fp32.
// Cost at V4.1 decode (S 16, E 384, k 6): reads 24.6 KB + 1.5 KB, writes 768 B; 2 fp64
// transcendentals per logit. Launch-bound (a few us); prefill (S 16384): 25 MB read, ~6 us of
// HBM time, the fp64 exp / log1p (~30 fp64 ops each, 2 x 6.3 M) about as much.
// Numerics: the host's fp32 steps in its order without contraction (division by gate_temp,
// sqrt, bias add, the pick-order sum, division, scale). exp and log1p are evaluated in fp64 and
// rounded once (correctly rounded but for rare double-rounding cases); the host calls glibc's
// expf (within ~0.5 ulp) and log1pf (within ~1 ulp, a different float in ~1% of arguments
// measured on glibc 2.36), so a score can differ from the host's by an ulp and a weight by a
// few. Selection order among equal biased scores: lower id (torch's order for the host's
// top_indices is not reproducible; equal fp32 scores do not occur with real logits).
// One block per token, a thread per expert (at least WARPS warps): all of them score the E
// logits into shared memory (the fp64 exp / log1p chains are the kernel's latency: ~20 us a
// token when one warp scored all 384), then warp 0 runs k rounds of a warp argmax. Hash routing:
// one thread per token, k logits read (S x k x 4 bytes: launch-bound).
// Graph-replayable: yes. Test: tests/cuda/router_test.cpp, ids equal, weights within 4 ulp.
#include "backend/cuda/router.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int WARPS = 4;
constexpr int MAX_E = 1024, MAX_K = 32;

// sqrt(softplus(logit / gate_temp)) with torch's threshold 20; exp and log1p in fp64.
__device__ __forceinline__ float gate_score(float logit, float gate_temp) {
    const float v = __fdiv_rn(logit, gate_temp);
    const float sp = v > 20.0f ? v : float(log1p(double(float(exp(double(v))))));
    return __fsqrt_rn(sp);
}

__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

__global__ void route_kernel(const float *logits, const float *bias, int64_t S, router_params p, int32_t *ids,
                             float *weights) {
    pdl_enter();
    extern __shared__ float smem[];  // score [E], biased [E]
    const int lane = threadIdx.x & 31, E = p.n_experts;
    const int64_t s = blockIdx.x;
    float *score = smem, *biased = score + E;
    // The fp64 transcendentals spread over the whole block (they, not the picks, set the time).
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        score[e] = gate_score(logits[s * E + e], p.gate_temp);
        biased[e] = __fadd_rn(score[e], bias[e]);
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    // This lane's biased scores in registers once: the k rounds then scan registers, where each
    // round's shared-memory reads had the warp waiting (ncu, H100 session 29: 7 us a token, ~40% of
    // its stalls on shared memory). Slots past E are never read (the e < E test).
    constexpr int PER_LANE = MAX_E / 32;
    float mine[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) mine[j] = lane + 32 * j < E ? biased[lane + 32 * j] : -__int_as_float(0x7f800000);
    uint32_t taken = 0;  // bit j: element lane + 32 j picked
    int pick[MAX_K];
    float sum = 0.0f;
    for (int r = 0; r < p.k; r++) {
        float bv = -__int_as_float(0x7f800000);
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            const int e = lane + 32 * j;
            if (e < E && !(taken >> j & 1u) && better(mine[j], e, bv, bi)) {
                bv = mine[j];
                bi = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        const bool found = bi < E;  // false only when every remaining score is NaN
        if (found && (bi & 31) == lane) taken |= 1u << (bi >> 5);
        const bool real = found && bv != -__int_as_float(0x7f800000);
        pick[r] = real ? bi : -1;
        if (real) sum = __fadd_rn(sum, score[bi]);  // the host sums in pick order
    }
    if (lane != 0) return;
    const bool norm = p.norm_topk_prob && p.k > 1;
    const float den = p.eps ? __fadd_rn(sum, 1e-20f) : sum;
    for (int r = 0; r < p.k; r++) {
        const int e = pick[r];
        float w = 0.0f;
        if (e >= 0) {
            w = score[e];
            if (norm) w = __fdiv_rn(w, den);
            w = __fmul_rn(w, p.route_scale);
        }
        ids[s * p.k + r] = e;
        weights[s * p.k + r] = w;
    }
}

__global__ void route_hash_kernel(const float *logits, const int32_t *tid2eid, int64_t vocab, const int32_t *tokens,
                                  int64_t S, router_params p, int32_t *ids, float *weights) {
    const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (s >= S) return;
    const int E = p.n_experts;
    const int32_t tok = tokens[s];
    const bool tok_ok = tok >= 0 && tok < vocab;
    int pick[MAX_K];
    float score[MAX_K];
    float sum = 0.0f;
    for (int r = 0; r < p.k; r++) {
        const int e = tok_ok ? tid2eid[int64_t(tok) * p.k + r] : -1;
        pick[r] = e >= 0 && e < E ? e : -1;
        score[r] = pick[r] >= 0 ? gate_score(logits[s * E + pick[r]], p.gate_temp) : 0.0f;
        if (pick[r] >= 0) sum = __fadd_rn(sum, score[r]);  // table order, as the host sums
    }
    const bool norm = p.norm_topk_prob && p.k > 1;
    const float den = p.eps ? __fadd_rn(sum, 1e-20f) : sum;
    for (int r = 0; r < p.k; r++) {
        float w = 0.0f;
        if (pick[r] >= 0) {
            w = score[r];
            if (norm) w = __fdiv_rn(w, den);
            w = __fmul_rn(w, p.route_scale);
        }
        ids[s * p.k + r] = pick[r];
        weights[s * p.k + r] = w;
    }
}

Status check_params(const char *what, int64_t S, const router_params &p) {
    if (S < 0 || p.n_experts < 1 || p.n_experts > MAX_E || p.k < 1 || p.k > MAX_K || p.k > p.n_experts ||
        !(p.gate_temp > 0))
        return Status::invalid_argument(std::string(what) + ": S " + std::to_string(S) + ", n_experts " +
                                        std::to_string(p.n_experts) + " (1.." + std::to_string(MAX_E) + "), k " +
                                        std::to_string(p.k) + " (1.." + std::to_string(MAX_K) + ", <= n_experts), gate_temp " +
                                        std::to_string(p.gate_temp) + " (> 0)");
    return Status::ok();
}

}  // namespace

Status route_topk(const float *logits, const float *bias, int64_t S, const router_params &p, int32_t *ids,
                  float *weights, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(check_params("route_topk", S, p));
    if (S == 0) return Status::ok();
    if (!logits || !bias || !ids || !weights) return Status::invalid_argument("route_topk: null logits, bias, ids or weights");
    if (S > 0x7fffffff) return Status::invalid_argument("route_topk: more than 2^31 tokens");
    const size_t smem = 2 * size_t(p.n_experts) * sizeof(float);  // <= 8 KB
    // One thread per expert (up to MAX_E): the fp64 chains, not the picks, set the time.
    const unsigned threads = unsigned(std::max(WARPS * 32, (p.n_experts + 31) / 32 * 32));
    (void)launch_pdl(route_kernel, unsigned(S), threads, smem, stream, logits, bias, S, p, ids, weights);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status route_hash(const float *logits, const int32_t *tid2eid, int64_t vocab, const int32_t *tokens, int64_t S,
                  const router_params &p, int32_t *ids, float *weights, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(check_params("route_hash", S, p));
    if (vocab < 1) return Status::invalid_argument("route_hash: vocab " + std::to_string(vocab) + " (>= 1)");
    if (S == 0) return Status::ok();
    if (!logits || !tid2eid || !tokens || !ids || !weights)
        return Status::invalid_argument("route_hash: null logits, tid2eid, tokens, ids or weights");
    constexpr int THREADS = 128;
    route_hash_kernel<<<unsigned((S + THREADS - 1) / THREADS), THREADS, 0, stream>>>(logits, tid2eid, vocab, tokens, S, p,
                                                                                       ids, weights);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
