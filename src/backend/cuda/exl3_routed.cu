// EXL3 routed-expert decode with the routing in device memory: (x quantized) -> rotate x per
// route and matrix -> GEMV(w1, w3 of every route) -> bf16 / SwiGLU / FP8 (exl3_moe's kernels) ->
// rotate h -> GEMV(w2) -> combine. Reference: exl3_moe (host routes), backend/cpu
// routed_expert_sum.
//
// One matrix per route: slot r = b K + k is row b's k-th pick; its expert comes from ids[r] in
// the kernels, so the launch shapes depend on B and K only. The GEMV work items are exl3_gemv's
// (exl3_gemv_kernel.cuh) with M = 1, K-sliced as plan_exl3_gemv slices B K routes' matrices.
//
// Cost at V4.1 decode (D 5120, I 2304, K = 2 trellis): per route w1 + w3 + w2 = 3 x 2.95 MB of
// trellis and 70.8 MFLOP of MMA (the tensor cores idle); B = 1: 6 routes, 53 MB, bound by the
// decode's integer work (exl3_gemv.cu: ~52 warp instructions per 16 x 16 tile, ~0.6 TB/s of
// trellis expected, ~90 us), not by HBM (~13 us at 4.2 TB/s). B = 16: 96 routes, 850 MB. The
// rotations move R (2 D + I) x 4 bytes in and 64 bytes per channel out (16 token slots, one
// used: the GEMV's fragment layout); SwiGLU and combine R (3 I + D) x 4 bytes: launch latency.
//
// Workspace (byte offsets in the plan): [error words][up counters for 128 routes][down counters
// for 128 routes] at offsets that do not depend on B, then xq [B, D] (OFFICIAL), xs_up [2R][D x
// 64 B], gate / up [2R, I], xs_down [R][I x 64 B], ye [R, D], split-K partials. Every region past
// the counters is written before it is read in a run, and the counters return to zero, so plans
// for any B of one layer shape can share the workspace of the largest.
//
// Invariants: B <= 16, B K <= 128; D, I multiples of 128; x 4-byte aligned; acc != x.
// Graph-capturable: yes (no host reads, no allocation). Deterministic. Launches per step: 6
// (TRANSFORMERS), 11 (OFFICIAL).
// Test: tests/cuda/exl3_routed_test.cpp (against exl3_moe on the same routes, and backend/cpu
// routed_expert_sum; graph replays with new routes; an expert not held).
#include "backend/cuda/exl3_routed.cuh"

#include <climits>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/exl3_gemv.cuh"
#include "backend/cuda/exl3_gemv_kernel.cuh"
#include "backend/cuda/fake_quant.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_numerics.cuh"
#include "backend/cuda/splitk_plan.cuh"
#include "backend/cuda/swiglu.cuh"

namespace ds41rt::backend::cuda {

namespace {

using namespace exl3_detail;
using splitk::align256;

enum { ERR_HELD = 0, ERR_HELD_ID, ERR_WORDS };

// One expert's matrices as the kernels read them: 0 = w1, 1 = w3, 2 = w2.
struct xrow {
    const uint32_t *trellis[3];
    const uint16_t *suh[3], *svh[3];
    int k[3], cb[3];
};

struct params {
    const xrow *table;
    int E, B, K, D, I;
    const float *x;  // the GEMV's input rows: x, or its FP8-quantized copy (OFFICIAL)
    const int32_t *ids;
    int *err;
    uint32_t *xs_up, *xs_down;  // [matrix][in / 16 tiles][16 tokens][16 words]
    float *gate, *up, *ye;      // gate [R, I] (h after the SwiGLU), up [R, I], ye [R, D]
    unsigned *counters_up, *counters_down;
    float *partials_up, *partials_down;
    int ks_up, ks_down, kt_up, kt_down;
    uint32_t cb_xor;
};

__device__ __forceinline__ bool held(const params &p, int e) { return e >= 0 && e < p.E && p.table[e].trellis[0]; }

// Block (r, which): slot r's input rotated by its expert's suh of matrix `which` (w1 / w3 from x,
// w2 from h). The up launch also flags a route to an expert not held.
__global__ void __launch_bounds__(THREADS) rotate_kernel(const __grid_constant__ params p, bool down) {
    const int r = blockIdx.x, which = down ? 2 : int(blockIdx.y);
    const int e = p.ids[r];
    if (!held(p, e)) {
        if (!down && blockIdx.y == 0 && threadIdx.x == 0 && e != -1 && atomicCAS(p.err + ERR_HELD, 0, 1) == 0)
            atomicExch(p.err + ERR_HELD_ID, e);
        return;  // uniform across the block
    }
    const int in = down ? p.I : p.D;
    const float *row = down ? p.gate + size_t(r) * p.I : p.x + size_t(r / p.K) * p.D;
    uint32_t *xs = down ? p.xs_down + size_t(r) * p.I * 16 : p.xs_up + (size_t(r) * 2 + which) * p.D * 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int blk = warp; blk < in / 128; blk += WARPS) rotate_block(row, p.table[e].suh[which], xs, in, 0, blk, lane);
}

// One exl3_gemv work item per block: matrix `mat` (up: 2 r + which, down: r), then its (output
// block, K slice).
__global__ void __launch_bounds__(THREADS) gemv_kernel(const __grid_constant__ params p, bool down) {
    const int N = down ? p.D : p.I, in = down ? p.I : p.D, ks = down ? p.ks_down : p.ks_up;
    const int per = (N / 128) * ks;
    const int mat = int(blockIdx.x) / per, local = int(blockIdx.x) - mat * per;
    const int r = down ? mat : mat >> 1, which = down ? 2 : (mat & 1);
    const int e = p.ids[r];
    if (!held(p, e)) return;  // uniform across the block
    const xrow &X = p.table[e];
    job J;
    J.trellis = X.trellis[which];
    J.svh = X.svh[which];
    J.xs = reinterpret_cast<const uint4 *>((down ? p.xs_down : p.xs_up) + size_t(mat) * in * 16);
    J.y = down ? p.ye + size_t(r) * p.D : (which ? p.up : p.gate) + size_t(r) * p.I;
    J.partials = (down ? p.partials_down : p.partials_up) + size_t(mat) * per * 128;
    J.counters = (down ? p.counters_down : p.counters_up) + size_t(mat) * (N / 128);
    J.in = in, J.out = N, J.k = X.k[which], J.cb = X.cb[which], J.M = 1;
    J.ksplit = ks, J.kt_per_split = down ? p.kt_down : p.kt_up, J.item_begin = 0;
    exl3_item<1>(J, local, p.cb_xor);
}

// acc[b, d] = 0 + term(route 1) + term(route 2) + ... over row b's held routes in increasing
// (expert id, pick): exl3_moe's scatter-adds expert by expert on a zeroed accumulator.
template <bool OFFICIAL_OUT>
__global__ void combine_kernel(const __grid_constant__ params p, const float *weights, bool weight_after, float *acc) {
    const int b = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= p.D) return;
    const int32_t *ids = p.ids + b * p.K;
    float sum = 0.0f;
    for (int pe = -1, pk = -1;;) {  // the next (expert, pick) after (pe, pk)
        int be = INT_MAX, bk = -1;
        for (int k = 0; k < p.K; k++) {
            const int e = ids[k];
            if (!held(p, e) || e < pe || (e == pe && k <= pk)) continue;
            if (e < be) be = e, bk = k;
        }
        if (bk < 0) break;
        const int r = b * p.K + bk;
        sum = __fadd_rn(sum, moe_detail::combine_term<OFFICIAL_OUT>(p.ye[size_t(r) * p.D + d], weight_after, weights[r]));
        pe = be, pk = bk;
    }
    acc[size_t(b) * p.D + d] = sum;
}

__global__ void flag_kernel(const int *err, int32_t *word, int32_t fail_value) {
    if (err[ERR_HELD]) *word = fail_value;
}

// The K slices plan_exl3_gemv picks for `n` matrices [out x in] at M = 1 (stand-in pointers: the
// planner reads no memory).
Result<int> ksplit_for(const device_info &dev, int n, int in, int out, int k) {
    exl3_matrix m;
    m.trellis = m.suh = m.svh = reinterpret_cast<const uint16_t *>(uintptr_t(256));
    m.x = reinterpret_cast<const float *>(uintptr_t(512));
    m.y = reinterpret_cast<float *>(uintptr_t(1024));
    m.in = in, m.out = out, m.k = k, m.M = 1;
    auto plan = plan_exl3_gemv(dev, std::vector<exl3_matrix>(size_t(n), m));
    if (!plan) return plan.status();
    return plan->ksplit[0];
}

}  // namespace

Result<exl3_routed_plan> plan_exl3_routed(const device_info &dev, const std::vector<exl3_expert_dev> &experts,
                                          const cpu::expert_numerics &nm, int64_t D, int B, int K) {
    const std::string where = "EXL3 routed experts (B " + std::to_string(B) + ", K " + std::to_string(K) + ")";
    if (B < 1 || B > MOE_MAX_ROWS || K < 1 || B * K > MOE_MAX_ROUTES)
        return Status::not_supported(where + ": at most " + std::to_string(MOE_MAX_ROWS) + " rows and " +
                                     std::to_string(MOE_MAX_ROUTES) + " routes a step");
    if (D < 128 || D % 128 != 0) return Status::invalid_argument(where + ": dim " + std::to_string(D) + " is not a multiple of 128");
    std::vector<xrow> rows(experts.size(), xrow{});
    int64_t I = 0;
    int k0 = 0;
    for (size_t e = 0; e < experts.size(); e++) {
        const exl3_expert_dev &x = experts[e];
        if (!x.w1.trellis) continue;
        if (I == 0) I = x.w1.out, k0 = x.w1.k;
        const std::string ex = where + ": expert " + std::to_string(e);
        if (!x.w2.trellis || !x.w3.trellis) return Status::invalid_argument(ex + ": w1 held without w2 and w3");
        if (x.w1.in != D || x.w3.in != D || x.w1.out != I || x.w3.out != I || x.w2.in != I || x.w2.out != D ||
            I % 128 != 0)
            return Status::invalid_argument(ex + ": w1 / w3 [" + std::to_string(x.w1.out) + ", " + std::to_string(x.w1.in) +
                                            "], w2 [" + std::to_string(x.w2.out) + ", " + std::to_string(x.w2.in) +
                                            "] do not fit dim " + std::to_string(D) + " and intermediate " +
                                            std::to_string(I) + " (multiples of 128)");
        const exl3_linear_dev *w[3] = {&x.w1, &x.w3, &x.w2};
        for (int i = 0; i < 3; i++) {
            if (w[i]->k < 1 || w[i]->k > 8 || int(w[i]->cb) < 0 || int(w[i]->cb) > 2 || !w[i]->suh || !w[i]->svh ||
                reinterpret_cast<uintptr_t>(w[i]->trellis) % 4 != 0)
                return Status::invalid_argument(ex + ": matrix " + std::to_string(i) + " has K " + std::to_string(w[i]->k) +
                                                ", codebook " + std::to_string(int(w[i]->cb)) +
                                                ", or a missing suh / svh or trellis not 4-byte aligned");
            rows[e].trellis[i] = reinterpret_cast<const uint32_t *>(w[i]->trellis);
            rows[e].suh[i] = w[i]->suh, rows[e].svh[i] = w[i]->svh;
            rows[e].k[i] = w[i]->k, rows[e].cb[i] = int(w[i]->cb);
        }
    }
    if (I == 0) return Status::invalid_argument(where + ": no expert is held");
    exl3_routed_plan p;
    p.B = B, p.K = K, p.E = int(experts.size()), p.D = int(D), p.I = int(I);
    p.act_block = nm.official ? int(nm.act_block) : 0;
    if (nm.official && (p.act_block <= 0 || D % p.act_block != 0 || I % p.act_block != 0))
        return Status::invalid_argument(where + ": FP8 block " + std::to_string(p.act_block) + " does not divide " +
                                        std::to_string(D) + " and " + std::to_string(I));
    p.swiglu_limit = nm.swiglu_limit;
    p.weight_after_w2 = nm.weight_after_w2;
    const int R = B * K;
    auto ku = ksplit_for(dev, 2 * R, int(D), int(I), k0);
    if (!ku) return ku.status();
    auto kd = ksplit_for(dev, R, int(I), int(D), k0);
    if (!kd) return kd.status();
    p.ks_up = ku.value(), p.ks_down = kd.value();
    p.kt_up = splitk::slice_len(int(D / 16), p.ks_up, U);
    p.kt_down = splitk::slice_len(int(I / 16), p.ks_down, U);

    size_t off = 0;
    auto take = [&](size_t bytes) {
        const size_t at = off;
        off += align256(bytes);
        return at;
    };
    p.off_err = take(ERR_WORDS * sizeof(int));
    p.off_counters_up = take(size_t(2 * MOE_MAX_ROUTES) * (I / 128) * sizeof(unsigned));
    p.off_counters_down = take(size_t(MOE_MAX_ROUTES) * (D / 128) * sizeof(unsigned));
    p.off_xq = take(nm.official ? size_t(B) * D * sizeof(float) : 0);
    p.off_xs_up = take(size_t(2 * R) * D * 64);
    p.off_gate = take(size_t(2 * R) * I * sizeof(float));
    p.off_xs_down = take(size_t(R) * I * 64);
    p.off_ye = take(size_t(R) * D * sizeof(float));
    p.off_partials_up = take(p.ks_up > 1 ? size_t(2 * R) * (I / 128) * p.ks_up * 128 * sizeof(float) : 0);
    p.off_partials_down = take(p.ks_down > 1 ? size_t(R) * (D / 128) * p.ks_down * 128 * sizeof(float) : 0);
    p.workspace_bytes = off;

    void *table = nullptr;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&table, rows.size() * sizeof(xrow)));
    p.owned_table = std::shared_ptr<void>(table, [](void *q) { cudaFree(q); });
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy(table, rows.data(), rows.size() * sizeof(xrow), cudaMemcpyHostToDevice));
    p.table = table;
    return p;
}

Status run_exl3_routed(const exl3_routed_plan &plan, const float *x, const int32_t *ids, const float *weights,
                       float *acc, void *workspace, cudaStream_t stream) {
    if (!x || !ids || !weights || !acc || !workspace) return Status::invalid_argument("run_exl3_routed: null pointer");
    if (static_cast<const void *>(acc) == static_cast<const void *>(x))
        return Status::invalid_argument("run_exl3_routed: acc aliases x");
    char *ws = static_cast<char *>(workspace);
    const bool official = plan.act_block > 0;
    const int R = plan.B * plan.K;
    params p{};
    p.table = static_cast<const xrow *>(plan.table);
    p.E = plan.E, p.B = plan.B, p.K = plan.K, p.D = plan.D, p.I = plan.I;
    p.ids = ids;
    p.err = reinterpret_cast<int *>(ws + plan.off_err);
    p.xs_up = reinterpret_cast<uint32_t *>(ws + plan.off_xs_up);
    p.xs_down = reinterpret_cast<uint32_t *>(ws + plan.off_xs_down);
    p.gate = reinterpret_cast<float *>(ws + plan.off_gate);
    p.up = p.gate + size_t(R) * plan.I;
    p.ye = reinterpret_cast<float *>(ws + plan.off_ye);
    p.counters_up = reinterpret_cast<unsigned *>(ws + plan.off_counters_up);
    p.counters_down = reinterpret_cast<unsigned *>(ws + plan.off_counters_down);
    p.partials_up = reinterpret_cast<float *>(ws + plan.off_partials_up);
    p.partials_down = reinterpret_cast<float *>(ws + plan.off_partials_down);
    p.ks_up = plan.ks_up, p.ks_down = plan.ks_down, p.kt_up = plan.kt_up, p.kt_down = plan.kt_down;
    p.cb_xor = 0x3B603B60u;
    p.x = x;
    if (official) {  // the FP8 quantization of x is per row: quantizing the rows is quantizing every route's input
        float *xq = reinterpret_cast<float *>(ws + plan.off_xq);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(xq, x, size_t(plan.B) * plan.D * sizeof(float),
                                                    cudaMemcpyDeviceToDevice, stream));
        DS41RT_RETURN_IF_ERROR(fake_quant_fp8_ue8m0(xq, plan.B, plan.D, plan.act_block, stream));
        p.x = xq;
    }
    rotate_kernel<<<dim3(unsigned(R), 2), THREADS, 0, stream>>>(p, false);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    gemv_kernel<<<unsigned(2 * R * (plan.I / 128) * plan.ks_up), THREADS, 0, stream>>>(p, false);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (official) DS41RT_RETURN_IF_ERROR(round_bf16_inplace(p.gate, 2 * int64_t(R) * plan.I, stream));
    DS41RT_RETURN_IF_ERROR(swiglu_rows(p.gate, p.up, plan.weight_after_w2 ? nullptr : weights, p.gate, R, plan.I,
                                       plan.swiglu_limit, official, stream));
    if (official) DS41RT_RETURN_IF_ERROR(fake_quant_fp8_ue8m0(p.gate, R, plan.I, plan.act_block, stream));
    rotate_kernel<<<dim3(unsigned(R), 1), THREADS, 0, stream>>>(p, true);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    gemv_kernel<<<unsigned(R * (plan.D / 128) * plan.ks_down), THREADS, 0, stream>>>(p, true);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const dim3 grid(unsigned((plan.D + 255) / 256), unsigned(plan.B));
    if (official) combine_kernel<true><<<grid, 256, 0, stream>>>(p, weights, plan.weight_after_w2, acc);
    else combine_kernel<false><<<grid, 256, 0, stream>>>(p, weights, plan.weight_after_w2, acc);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status exl3_routed_flag_error(const exl3_routed_plan &plan, const void *workspace, int32_t *word, int32_t fail_value,
                              cudaStream_t stream) {
    if (!workspace || !word) return Status::invalid_argument("exl3_routed_flag_error: null workspace or word");
    flag_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<const int *>(static_cast<const char *>(workspace) + plan.off_err),
                                     word, fail_value);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

static_assert(EXL3_ROUTED_ERROR_WORDS == ERR_WORDS, "the header's error word count");

Status exl3_routed_error_copy(const exl3_routed_plan &plan, void *workspace, int32_t *host_words, cudaStream_t stream) {
    return stage_error_words(static_cast<char *>(workspace) + plan.off_err, ERR_WORDS, host_words, stream);
}

Status exl3_routed_error(const exl3_routed_plan &plan, void *workspace, cudaStream_t stream) {
    int32_t err[ERR_WORDS] = {};
    DS41RT_RETURN_IF_ERROR(exl3_routed_error_copy(plan, workspace, err, stream));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return exl3_routed_error_status(plan, err);
}

Status exl3_routed_error_status(const exl3_routed_plan &plan, const int32_t *err) {
    if (err[ERR_HELD])
        return Status::invalid_argument("EXL3 routed experts: a route names expert " + std::to_string(err[ERR_HELD_ID]) +
                                        ", which is not held here (table of " + std::to_string(plan.E) + ")");
    return Status::ok();
}

exl3_routed_runner::~exl3_routed_runner() {
    if (ws_) cudaFree(ws_);
}

Status exl3_routed_runner::run(const device_info &dev, int layer, const std::vector<exl3_expert_dev> &experts,
                               const cpu::expert_numerics &nm, int64_t D, int B, int K, const float *x,
                               const int32_t *ids, const float *weights, float *acc, cudaStream_t stream) {
    auto plan_for = [&](int rows) -> Result<const exl3_routed_plan *> {
        auto it = plans_.find({layer, rows});
        if (it == plans_.end()) {
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &cs));
            if (cs != cudaStreamCaptureStatusNone)
                return Status::internal("layer " + std::to_string(layer) + ": no EXL3 routed-expert plan for " +
                                        std::to_string(rows) + " rows while a graph is being captured");
            auto p = plan_exl3_routed(dev, experts, nm, D, rows, K);
            if (!p) return p.status();
            it = plans_.emplace(std::make_pair(layer, rows), std::move(p.value())).first;
        }
        return &it->second;
    };
    if (!ws_) {  // graphs captured later hold its address: never reallocated
        auto big = plan_for(MOE_MAX_ROWS);
        if (!big) return big.status();
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws_, (*big)->workspace_bytes));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws_, 0, (*big)->workspace_bytes, stream));
        bytes_ = (*big)->workspace_bytes;
    }
    auto plan = plan_for(B);
    if (!plan) return plan.status();
    if ((*plan)->workspace_bytes > bytes_)
        return Status::internal("layer " + std::to_string(layer) + ": EXL3 routed-expert workspace of " +
                                std::to_string((*plan)->workspace_bytes) + " bytes exceeds the shared " +
                                std::to_string(bytes_));
    any_ = *plan;
    return run_exl3_routed(**plan, x, ids, weights, acc, ws_, stream);
}

Status exl3_routed_runner::error(cudaStream_t stream) { return any_ ? exl3_routed_error(*any_, ws_, stream) : Status::ok(); }
Status exl3_routed_runner::error_copy(int32_t *host_words, cudaStream_t stream) {
    return any_ ? exl3_routed_error_copy(*any_, ws_, host_words, stream) : Status::ok();
}
Status exl3_routed_runner::error_status(const int32_t *host_words) const {
    return any_ ? exl3_routed_error_status(*any_, host_words) : Status::ok();
}

Status exl3_routed_runner::flag_error(int32_t *word, int32_t fail_value, cudaStream_t stream) const {
    return any_ ? exl3_routed_flag_error(*any_, ws_, word, fail_value, stream) : Status::ok();
}

}  // namespace ds41rt::backend::cuda
