// Routed-expert decode for one MoE layer with the routing in device memory: group -> split x ->
// GEMV(w1, w3 of every selected expert) -> clamped SwiGLU + split h -> GEMV(w2) -> combine.
// Reference: backend/cpu routed_expert_sum; bit-identical to run_moe_decode (moe_decode.cu) for
// the same routes.
//
// Cost at V4.1 decode (D 5120, I 2304, MXFP4 + E8M0, K 6): per selected expert w1 + w3 + w2 and
// their scales, 18.8 MB read once for all of its rows, 2 * 3 * 2304 * 5120 = 70.8 MFLOP per
// route (~4 FLOP per weight byte against a ~300 FLOP/byte ridge: HBM-bound). B = 1: 6 experts,
// 113 MB, ~27 us at the H200's ~4.2 TB/s copy rate; B = 16 with uniform routing ~85 of 384
// experts, ~1.6 GB, ~0.38 ms. NVFP4: 19.9 MB per expert, 119.5 MB at B = 1. The small kernels
// (group, split, SwiGLU + split, combine) move B * K * (2 D + 3 I + D) * 4 bytes (1.4 MB at B * K =
// 96) and cost launch latency, not bandwidth.
//
// Grouping on the device (moe_routed_group_kernel, one block of 128 threads): the B * K routes
// are ranked by (expert, row, k), exactly the order of plan_moe_decode's stable sort, into R_v
// slots (dropped and not-held routes get none); each selected expert u (in increasing id) gets
// a job (expert, first slot, rows) and each token row its slot list in increasing slot, which is
// increasing expert id. Ranks by counting (moe_grouping.h; R <= 128, so each thread scans the
// routes twice).
//
// The GEMVs: the work-item bodies of gemv.cu / nvfp4_gemv.cu (gemv_kernel.cuh,
// nvfp4_gemv_kernel.cuh), fed a job built from the device job table instead of kernel parameters.
// The grid is fixed for the worst case U = min(B * K, E); a warp whose item lies past the step's
// item count (read from the group kernel's output) exits at once. The K slicing of U selected
// experts is the one plan_gemv / plan_nvfp4_gemv would pick for the same launch (a table built on
// the host by asking them, indexed by U and the largest group's token tiles), so every partial
// sum is formed and added in the same order: same bits. The kernels are instantiated per token
// tiles (nt = 1: 8 rows, 2: 16); plans of B <= 8 launch the one-tile instance (an expert's group
// has at most B rows when no row repeats an id, as the routers guarantee), plans above launch
// both, and the step's largest group picks the one that works (META_NT: the instance
// run_moe_decode picks for those groups); the other's blocks leave at once. (Running the
// two-tile instance for a step whose groups all have <= 8 rows would give the same sums, its
// second tile adding zeros, at half the resident blocks.) A group larger than 8 * nt rows (a row
// repeating an id) is refused: error word, zero output.
//
// x for the GEMVs is split (or quantized) per slot row straight from x [B, D] (no gathered fp32
// copy): the split / quantization is per row, so slot s gets the bits run_moe_decode's gathered
// row would. Each expert's activation scales (official: [D / 32][16], repeated per 32-k block;
// NVFP4: the per-row multipliers) live in a per-job region, at the row's position in its group.
// At B = 1 in official numerics x's producer may have split it already (run_moe_routed's
// x_split): every up job then reads that one row, and the split launch is skipped (V4.1 C1, 16
// layers, H200: 3.96 / 3.93 -> 3.88 / 3.88 ms median a step, session 20 run 4).
//
// Numerics: moe_numerics.cuh (the same source as run_moe_decode's kernels); see moe_decode.cu.
// Invariants: B <= 16, B * K <= 128, D and I multiples of 32, x 16-byte aligned, out != x.
// Graph-capturable: yes, for any routing (launch shapes fixed by the plan; no host reads, no
// allocation, no route-dependent memset). Deterministic. Launches per step: 6 (5 with x's split
// given at B = 1; 8 for plans of more than 8 rows: both GEMV instances).
// Test: tests/cuda/moe_routed_test.cpp (bit-identical to run_moe_decode; CPU reference at
// moe_decode_test's tolerance; graph replay with new routes; bandwidth line).
#include "backend/cuda/moe_routed.cuh"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/gemv_kernel.cuh"
#include "backend/cuda/moe_grouping.h"
#include "backend/cuda/moe_numerics.cuh"
#include "backend/cuda/nvfp4_gemv.cuh"
#include "backend/cuda/nvfp4_gemv_kernel.cuh"

namespace ds41rt::backend::cuda {

namespace {

namespace gd = gemv_detail;
namespace nd = nvfp4_detail;
using namespace moe_detail;

static_assert(gd::WARPS == nd::WARPS, "one item-to-warp mapping for both GEMV families");
constexpr int WARPS = gd::WARPS;
constexpr int GROUP_THREADS = MOE_MAX_ROUTES;

// Error words and the step's shape, as the group kernel leaves them.
enum { ERR_HELD = 0, ERR_HELD_ID, ERR_ROWS, ERR_ROWS_ID, ERR_WORDS };
enum { META_U = 0, META_SLOTS, META_NT, META_KS_UP, META_KS_DOWN, META_ITEMS_UP, META_ITEMS_DOWN, META_WORDS };

// The workspace's routing region: ints (and the fp32 slot weights), R = B * K slots at most.
struct routing_view {
    int *err, *meta;
    int *slot_row, *slot_u, *slot_m;
    float *slot_weight;
    int *job_expert, *job_off, *job_m;
    int *row_n, *row_slot;
};

size_t routing_words(int B, int K, int u_max) { return ERR_WORDS + META_WORDS + 5 * size_t(B) * K + 3 * u_max + B; }

routing_view routing_at(void *base, int B, int K, int u_max) {
    int *p = static_cast<int *>(base);
    const int R = B * K;
    routing_view v;
    v.err = p, p += ERR_WORDS;
    v.meta = p, p += META_WORDS;
    v.slot_row = p, p += R;
    v.slot_u = p, p += R;
    v.slot_m = p, p += R;
    v.slot_weight = reinterpret_cast<float *>(p), p += R;
    v.job_expert = p, p += u_max;
    v.job_off = p, p += u_max;
    v.job_m = p, p += u_max;
    v.row_n = p, p += B;
    v.row_slot = p;
    return v;
}

struct routed_params {
    const moe_routed_expert *table;
    int E, B, K, D, I, act_block, max_rows;  // max_rows: 8 * the plan's token tiles
    float limit;
    bool weight_after;
    routing_view r;
    const float *x;
    bool x_split;  // xs_up / sx_up hold x's one row split by its producer (B = 1): every up job reads it
    float *out;
    const int32_t *ids;
    const float *weights;
    uint8_t *xs_up, *xs_down;
    float *sx_up, *sx_down;  // official: [u_max][act blocks][16]; NVFP4: [u_max][16] row multipliers
    float *gate, *up, *h, *ye;
    unsigned *counters_up, *counters_down;
    float *partials_up, *partials_down;
    int ksplit_up[2][MOE_MAX_ROUTES + 1], ksplit_down[2][MOE_MAX_ROUTES + 1];
};

__device__ __forceinline__ bool held(const moe_routed_expert *table, int E, int e) {
    return e >= 0 && e < E && table[e].w1 && table[e].w2 && table[e].w3;
}

__global__ void __launch_bounds__(GROUP_THREADS) moe_routed_group_kernel(const __grid_constant__ routed_params p) {
    pdl_enter();
    __shared__ int se[GROUP_THREADS], sfirst[GROUP_THREADS], srank[GROUP_THREADS];
    __shared__ int s_u, s_slots, s_max_rows, s_over;
    const int t = threadIdx.x, R = p.B * p.K;
    if (t == 0) s_u = 0, s_slots = 0, s_max_rows = 0, s_over = -1;
    int e = -1;
    if (t < R) {
        e = p.ids[t];
        if (e != -1 && !held(p.table, p.E, e)) {
            if (atomicCAS(p.r.err + ERR_HELD, 0, 1) == 0) atomicExch(p.r.err + ERR_HELD_ID, e);
            e = -1;
        }
    }
    se[t] = e;
    __syncthreads();
    route_group g;
    if (e >= 0) {
        g = group_route(se, R, t);
        atomicAdd(&s_slots, 1);
        if (g.first) {
            atomicAdd(&s_u, 1);
            atomicMax(&s_max_rows, g.rows);
            if (g.rows > p.max_rows) atomicExch(&s_over, e);
        }
    }
    sfirst[t] = e >= 0 && g.first;
    srank[t] = g.rank;
    __syncthreads();
    const bool over = s_over >= 0;
    if (e >= 0 && !over) {
        const route_place pl = place_route(se, sfirst, srank, R, p.K, t);
        const int b = t / p.K;
        p.r.slot_row[g.rank] = b;
        p.r.slot_weight[g.rank] = p.weights[t];
        p.r.slot_u[g.rank] = pl.job;
        p.r.slot_m[g.rank] = g.rank - g.off;
        p.r.row_slot[b * p.K + pl.pos] = g.rank;
        if (g.first) p.r.job_expert[pl.job] = e, p.r.job_off[pl.job] = g.off, p.r.job_m[pl.job] = g.rows;
    }
    if (t < p.B) {
        int n = 0;
        for (int r = t * p.K; r < (t + 1) * p.K; r++) n += se[r] >= 0;
        p.r.row_n[t] = over ? 0 : n;
    }
    if (t == 0) {
        if (over && atomicCAS(p.r.err + ERR_ROWS, 0, 1) == 0) atomicExch(p.r.err + ERR_ROWS_ID, s_over);
        const int U = over ? 0 : s_u, nt = s_max_rows > 8 ? 2 : 1;
        const int ks_up = U ? p.ksplit_up[nt - 1][U] : 0, ks_down = U ? p.ksplit_down[nt - 1][U] : 0;
        p.r.meta[META_U] = U;
        p.r.meta[META_SLOTS] = over ? 0 : s_slots;
        p.r.meta[META_NT] = nt;
        p.r.meta[META_KS_UP] = ks_up;
        p.r.meta[META_KS_DOWN] = ks_down;
        p.r.meta[META_ITEMS_UP] = 2 * U * ((p.I + 15) / 16) * ks_up;
        p.r.meta[META_ITEMS_DOWN] = U * ((p.D + 15) / 16) * ks_down;
    }
}

// Split (MXFP4) or quantize (NVFP4) slot row s for the up (x) or down (h) GEMV; thread tid of
// nthreads (NVFP4: the whole block, tid = threadIdx.x). MXFP4 modes may take channels [c0, c1)
// of the row only (c0 and c1 whole activation blocks, multiples of 4): the split is per block.
template <int MODE>
__device__ __forceinline__ void split_row(const routed_params &p, int s, bool down, int tid, int nthreads, int c0 = 0,
                                          int c1 = -1) {
    const int Kd = down ? p.I : p.D, u = p.r.slot_u[s], m = p.r.slot_m[s];
    const float *src = down ? p.h + size_t(s) * p.I : p.x + size_t(p.r.slot_row[s]) * p.D;
    uint8_t *xs = down ? p.xs_down : p.xs_up;
    float *sx = down ? p.sx_down : p.sx_up;
    if constexpr (MODE == NVFP4) {
        const moe_routed_expert &X = p.table[p.r.job_expert[u]];
        nd::quant_job Q;
        Q.x = src, Q.xs = reinterpret_cast<uint4 *>(xs + size_t(s) * Kd * 2), Q.rowmul = sx + u * 16 + m;
        Q.input_scale = down ? X.w2_input_scale : X.w13_input_scale, Q.M = 1, Q.K = Kd;
        nd::quant_x_row(Q, 0);
    } else {
        if (c1 < 0) c1 = Kd;
        gd::split_job J;
        J.x = src + c0, J.M = 1, J.K = c1 - c0, J.ldx = J.K, J.act_block = MODE == OFFICIAL ? p.act_block : 0;
        J.xs = xs + (size_t(s) * Kd + c0) * (MODE == OFFICIAL ? gd::X8_BYTES : 4);
        J.sx = MODE == OFFICIAL ? sx + (size_t(u) * (Kd / 32) + c0 / 32) * gd::SX_TOKENS + m : nullptr;
        gd::split_x_rows(J, tid, nthreads);
    }
}

// x's slot rows for the up GEMV, one slot per blockIdx.y.
template <int MODE>
__global__ void moe_routed_split_kernel(const __grid_constant__ routed_params p) {
    pdl_enter();
    const int s = blockIdx.y;
    if (s >= p.r.meta[META_SLOTS]) return;  // uniform across the block
    split_row<MODE>(p, s, false, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

// The matrices of one launch: up = (w1, w3) of each selected expert in job order; down = w2.
struct matrix_ref {
    const moe_routed_expert *X;
    int u, which, off, M, N, K, mat, local;
};

__device__ __forceinline__ bool locate(const routed_params &p, bool down, int item, matrix_ref &m) {
    const int items = p.r.meta[down ? META_ITEMS_DOWN : META_ITEMS_UP];
    if (item >= items) return false;
    const int ks = p.r.meta[down ? META_KS_DOWN : META_KS_UP];
    m.N = down ? p.D : p.I, m.K = down ? p.I : p.D;
    const int per = ((m.N + 15) / 16) * ks;
    m.mat = item / per, m.local = item - m.mat * per;
    m.u = down ? m.mat : m.mat >> 1;
    m.which = down ? 2 : (m.mat & 1);
    m.off = p.r.job_off[m.u], m.M = p.r.job_m[m.u];
    m.X = p.table + p.r.job_expert[m.u];
    return true;
}

// At least 6 (NT 1) / 3 (NT 2) blocks per SM: ptxas then fits the item in 80 / 168 registers
// with no stack. NT 1: the extra resident warps hide more of the weight stream's latency (H200,
// one V4.1 layer in official numerics, 105.1 -> 91.4 us at B = 1 against 5 blocks; 7 blocks: 95.3;
// and at e3edb34 the 16-layer C1 step 5.83 ms at 6 blocks, 6.09-6.12 at 5). NT 2: 4 blocks held
// it to 128 registers with 88 bytes of stack spilled in the loop; 3 blocks run the 16-layer C16
// step in 31.31-31.61 ms against 32.14-32.24 (H200, 2026-12-01, two runs each).
constexpr int mxfp4_min_blocks(int nt) { return nt == 1 ? 6 : 3; }
// ONE: a plan of one token row (B = 1), so every expert's group has one row (gemv_item).
template <bool X8, int NT, bool ONE = false>
__global__ void __launch_bounds__(WARPS * 32, mxfp4_min_blocks(NT))
    moe_routed_mxfp4_kernel(const __grid_constant__ routed_params p, bool down) {
    pdl_enter();
    if (p.r.meta[META_NT] != NT) return;  // the step's other instance runs it (see run_moe_routed)
    matrix_ref m;
    if (!locate(p, down, blockIdx.x * WARPS + (threadIdx.x >> 5), m)) return;  // uniform across the warp
    const int ks = p.r.meta[down ? META_KS_DOWN : META_KS_UP], tiles = (m.N + 15) / 16;
    constexpr int SLOT = NT * 4 * 32, KPS = gd::CHUNK / 16;
    gd::job J;
    J.w = m.which == 0 ? m.X->w1 : m.which == 1 ? m.X->w3 : m.X->w2;
    J.scale = m.which == 0 ? m.X->w1_scale : m.which == 1 ? m.X->w3_scale : m.X->w2_scale;
    const bool given = !down && p.x_split;
    J.xs = (down ? p.xs_down : p.xs_up) + (given ? 0 : size_t(m.off) * m.K * (X8 ? gd::X8_BYTES : 4));
    J.sx = X8 ? (down ? p.sx_down : p.sx_up) + (given ? 0 : size_t(m.u) * (m.K / 32) * gd::SX_TOKENS) : nullptr;
    J.y = down ? p.ye + size_t(m.off) * p.D : (m.which ? p.up : p.gate) + size_t(m.off) * p.I;
    J.partials = (down ? p.partials_down : p.partials_up) + size_t(m.mat) * tiles * ks * SLOT;
    J.counters = (down ? p.counters_down : p.counters_up) + size_t(m.mat) * tiles;
    J.N = m.N, J.K = m.K, J.M = m.M, J.ldy = m.N;
    J.scols = m.K / 32;
    J.sshift = 0;
    J.row_block_shift = 0;
    J.ksplit = ks;
    J.kb_per_split = ((m.K / 32 + ks - 1) / ks + KPS - 1) / KPS * KPS;  // as run_gemv
    J.item_begin = 0;
    J.round_out = false;  // h and the expert outputs are rounded by moe_numerics where the CPU rounds
    gd::gemv_item<true, X8, NT, false, ONE>(J, m.local);
}

template <int NT>
__global__ void __launch_bounds__(WARPS * 32) moe_routed_nvfp4_kernel(const __grid_constant__ routed_params p, bool down) {
    pdl_enter();
    if (p.r.meta[META_NT] != NT) return;  // the step's other instance runs it (see run_moe_routed)
    matrix_ref m;
    if (!locate(p, down, blockIdx.x * WARPS + (threadIdx.x >> 5), m)) return;
    const int ks = p.r.meta[down ? META_KS_DOWN : META_KS_UP], tiles = (m.N + 15) / 16;
    constexpr int SLOT = NT * 4 * 32;
    nd::job J;
    J.w = m.which == 0 ? m.X->w1 : m.which == 1 ? m.X->w3 : m.X->w2;
    J.scale = m.which == 0 ? m.X->w1_scale : m.which == 1 ? m.X->w3_scale : m.X->w2_scale;
    J.xs = reinterpret_cast<const uint4 *>((down ? p.xs_down : p.xs_up) + size_t(m.off) * m.K * 2);
    J.rowmul = (down ? p.sx_down : p.sx_up) + m.u * 16;
    J.y = down ? p.ye + size_t(m.off) * p.D : (m.which ? p.up : p.gate) + size_t(m.off) * p.I;
    J.partials = (down ? p.partials_down : p.partials_up) + size_t(m.mat) * tiles * ks * SLOT;
    J.counters = (down ? p.counters_down : p.counters_up) + size_t(m.mat) * tiles;
    J.alpha = (down ? m.X->w2_weight_scale_2 : m.X->w13_weight_scale_2) * (1.0f / 256.0f);
    J.N = m.N, J.K = m.K, J.M = m.M;
    J.ksplit = ks;
    J.chunks_per_split = ((m.K + nd::CHUNK_K - 1) / nd::CHUNK_K + ks - 1) / ks;  // as run_nvfp4_gemv
    J.item_begin = 0;
    nd::nvfp4_item<NT>(J, m.local);
}

// Channels [chunk x, chunk (x + 1)) of slot row y per block: h = SwiGLU(gate, up) [* weight],
// then that h split for the down GEMV (the block's own writes, visible to it after the barrier).
// Fused: one launch fewer per step. MXFP4 modes take chunks of SWIGLU_CHUNK channels (whole
// activation blocks: at decode one block per row left 6 blocks for the GPU, ~10 us); NVFP4's
// quantization needs the whole row (chunk = I).
constexpr int SWIGLU_CHUNK = 256;
template <int MODE>
__global__ void __launch_bounds__(256) moe_routed_swiglu_kernel(const __grid_constant__ routed_params p, bool weight_before,
                                                                int chunk) {
    pdl_enter();
    const int s = blockIdx.y;
    if (s >= p.r.meta[META_SLOTS]) return;  // uniform across the block
    const float w = weight_before ? p.r.slot_weight[s] : 0.0f;
    const size_t row = size_t(s) * p.I;
    const int c0 = blockIdx.x * chunk, c1 = min(p.I, c0 + chunk);
    for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x)
        p.h[row + i] = swiglu_h<MODE>(p.gate[row + i], p.up[row + i], p.limit, weight_before, w);
    __syncthreads();
    split_row<MODE>(p, s, true, threadIdx.x, blockDim.x, c0, c1);
}

template <bool OFFICIAL_OUT>
__global__ void moe_routed_combine_kernel(const __grid_constant__ routed_params p) {
    pdl_enter();
    const int b = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= p.D) return;
    float acc = 0.0f;
    const int n = p.r.row_n[b];
    for (int j = 0; j < n; j++) {
        const int s = p.r.row_slot[b * p.K + j];
        acc = __fadd_rn(acc, combine_term<OFFICIAL_OUT>(p.ye[size_t(s) * p.D + d], p.weight_after, p.r.slot_weight[s]));
    }
    p.out[size_t(b) * p.D + d] = acc;
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

template <typename F>
void allow_smem(F *kernel) {
    if constexpr (gd::SMEM_BYTES > 48 * 1024)
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, gd::SMEM_BYTES);
}

// The K slicing plan_gemv / plan_nvfp4_gemv pick for U experts of this layer whose largest group
// has `rows` rows: asked of them with stand-in pointers (they read no memory). Remembered per
// shape, so the plans of every layer and row bucket (43 x 16 for V4.1) ask once: a plan for
// B = 16 asks 2 x 2 x 96 times, each plan_gemv check quadratic in its matrix count.
Result<int> ksplit_uncached(const device_info &dev, const moe_layer &layer, bool nvfp4, bool down, int U, int rows);

Result<int> ksplit_for(const device_info &dev, const moe_layer &layer, bool nvfp4, bool down, int U, int rows) {
    using key = std::tuple<int, int, int, int, int, bool, bool, int, int>;
    static std::mutex mu;
    static std::map<key, int> seen;
    const key k{dev.device, dev.sm_count, layer.D, layer.I, nvfp4 ? 0 : layer.act_block, nvfp4, down, U, rows};
    {
        std::lock_guard<std::mutex> lock(mu);
        auto it = seen.find(k);
        if (it != seen.end()) return it->second;
    }
    auto ks = ksplit_uncached(dev, layer, nvfp4, down, U, rows);
    if (!ks) return ks.status();
    std::lock_guard<std::mutex> lock(mu);
    seen[k] = ks.value();
    return ks.value();
}

Result<int> ksplit_uncached(const device_info &dev, const moe_layer &layer, bool nvfp4, bool down, int U, int rows) {
    const int N = down ? layer.D : layer.I, K = down ? layer.I : layer.D;
    const auto *fake = reinterpret_cast<const uint8_t *>(uintptr_t(256));
    const auto *fake_x = reinterpret_cast<const float *>(uintptr_t(256));
    const int nmat = down ? U : 2 * U;
    if (nvfp4) {
        nvfp4_matrix m;
        m.w = fake, m.scale = fake, m.weight_scale_2 = 1, m.input_scale = 1;
        m.N = N, m.K = K, m.x = fake_x, m.y = reinterpret_cast<float *>(uintptr_t(512)), m.M = rows;
        auto plan = plan_nvfp4_gemv(dev, std::vector<nvfp4_matrix>(size_t(nmat), m));
        if (!plan) return plan.status();
        return plan.value().ksplit[0];
    }
    gemv_matrix m;
    m.w = fake, m.scale = fake, m.fp4 = true, m.act_block = layer.act_block;
    m.N = N, m.K = K, m.x = fake_x, m.y = reinterpret_cast<float *>(uintptr_t(512)), m.M = rows;
    auto plan = plan_gemv(dev, std::vector<gemv_matrix>(size_t(nmat), m));
    if (!plan) return plan.status();
    return plan.value().ksplit[0];
}

}  // namespace

size_t moe_routed_table_bytes(int experts) { return align256(size_t(std::max(experts, 1)) * sizeof(moe_routed_expert)); }

Result<moe_routed_plan> plan_moe_routed(const device_info &dev, const moe_layer &layer, int B, int K, void *table_memory) {
    const int D = layer.D, I = layer.I;
    if (B < 1 || B > MOE_MAX_ROWS || K < 1 || B * K > MOE_MAX_ROUTES)
        return Status::not_supported("moe routed: " + std::to_string(B) + " rows x " + std::to_string(K) +
                                     " routes (at most " + std::to_string(MOE_MAX_ROWS) + " rows, " +
                                     std::to_string(MOE_MAX_ROUTES) + " routes)");
    if (D <= 0 || I <= 0 || D % 32 || I % 32)
        return Status::not_supported("moe routed: D " + std::to_string(D) + " and I " + std::to_string(I) +
                                     " must be positive multiples of 32");
    const bool nvfp4 = !layer.nvfp4_experts.empty();
    const int ab = nvfp4 ? 0 : layer.act_block;
    if (ab != 0 && ab != 32 && ab != 128) return Status::not_supported("moe routed: act_block " + std::to_string(ab));
    if (ab && (D % ab || I % ab))
        return Status::not_supported("moe routed: act_block " + std::to_string(ab) + " must divide D and I");
    const int E = int(nvfp4 ? layer.nvfp4_experts.size() : layer.experts.size());
    if (E < 1) return Status::invalid_argument("moe routed: the layer's expert table is empty");

    moe_routed_plan plan;
    plan.B = B, plan.K = K, plan.E = E, plan.D = D, plan.I = I;
    plan.u_max = std::min(B * K, E);
    plan.nt = B > 8 ? 2 : 1;
    plan.act_block = ab, plan.swiglu_limit = layer.swiglu_limit;
    plan.weight_after_w2 = layer.weight_after_w2, plan.nvfp4 = nvfp4;

    // K slicing per (token tiles, U) and the worst-case grids and partial-sum space.
    const int tiles_up = (I + 15) / 16, tiles_down = (D + 15) / 16, slot = plan.nt * 4 * 32;
    size_t partials_up = 0, partials_down = 0;
    long items_up = 0, items_down = 0;
    for (int nt = 1; nt <= plan.nt; nt++)
        for (int U = 1; U <= plan.u_max; U++) {
            const int rows = nt == 2 ? 9 : 1;
            auto ku = ksplit_for(dev, layer, nvfp4, false, U, rows);
            if (!ku) return ku.status();
            auto kd = ksplit_for(dev, layer, nvfp4, true, U, rows);
            if (!kd) return kd.status();
            plan.ksplit_up[nt - 1][U] = ku.value(), plan.ksplit_down[nt - 1][U] = kd.value();
            items_up = std::max(items_up, long(2) * U * tiles_up * ku.value());
            items_down = std::max(items_down, long(U) * tiles_down * kd.value());
        }
    partials_up = size_t(items_up) * slot, partials_down = size_t(items_down) * slot;
    plan.up_blocks = int((items_up + WARPS - 1) / WARPS), plan.down_blocks = int((items_down + WARPS - 1) / WARPS);
    // Split grids as run_gemv sizes them for one row (NVFP4: one block per row).
    auto split_blocks = [&](int Kd) {
        if (nvfp4) return 1;
        const int work = ab ? (Kd / ab) * 32 : Kd / 4;
        return std::min(1024, (work + 255) / 256);
    };
    plan.split_blocks_up = split_blocks(D);

    // Workspace layout: [routing][xs up][sx up][xs down][sx down][gate][up][h][ye][counters up]
    // [counters down][partials up][partials down].
    const size_t R = size_t(B) * K, U = size_t(plan.u_max);
    const size_t x_elem = nvfp4 ? 2 : ab ? gd::X8_BYTES : 4;
    auto sx_bytes = [&](int Kd) { return nvfp4 ? U * 16 * 4 : ab ? U * (Kd / 32) * gd::SX_TOKENS * 4 : 4; };
    size_t off = 0;
    auto take = [&](size_t bytes) {
        const size_t at = off;
        off += align256(bytes);
        return at;
    };
    plan.off_routing = take(routing_words(B, K, plan.u_max) * 4);
    plan.off_xs_up = take(R * D * x_elem);
    plan.off_sx_up = take(sx_bytes(D));
    plan.off_xs_down = take(R * I * x_elem);
    plan.off_sx_down = take(sx_bytes(I));
    plan.off_gate = take(R * I * 4);
    plan.off_up = take(R * I * 4);
    plan.off_h = take(R * I * 4);
    plan.off_ye = take(R * D * 4);
    plan.off_counters_up = take(2 * U * tiles_up * 4);
    plan.off_counters_down = take(U * tiles_down * 4);
    plan.off_partials_up = take(partials_up * 4);
    plan.off_partials_down = take(partials_down * 4);
    plan.workspace_bytes = off;

    // The expert table, by id; an expert not held keeps null pointers. Held experts are checked
    // as plan_gemv / plan_nvfp4_gemv check their matrices (the kernels' 16-byte weight loads).
    auto aligned = [](const void *q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
    auto finite_pos = [](float v) { return std::isfinite(v) && v > 0; };
    std::vector<moe_routed_expert> table(size_t(E), moe_routed_expert{});
    for (int e = 0; e < E; e++) {
        moe_routed_expert &t = table[size_t(e)];
        const std::string what = "moe routed: expert " + std::to_string(e);
        if (nvfp4) {
            const moe_nvfp4_expert &w = layer.nvfp4_experts[size_t(e)];
            if (w.w1 && w.w2 && w.w3) {
                if (!w.w1_scale || !w.w2_scale || !w.w3_scale || !aligned(w.w1, 16) || !aligned(w.w2, 16) || !aligned(w.w3, 16) ||
                    !aligned(w.w1_scale, 2) || !aligned(w.w2_scale, 2) || !aligned(w.w3_scale, 2))
                    return Status::invalid_argument(what + ": weights must be 16-byte aligned, scales set and 2-byte aligned");
                if (!finite_pos(w.w13_weight_scale_2) || !finite_pos(w.w13_input_scale) || !finite_pos(w.w2_weight_scale_2) ||
                    !finite_pos(w.w2_input_scale))
                    return Status::invalid_argument(what + ": weight_scale_2 and input_scale must be positive and finite");
            }
            t.w1 = w.w1, t.w1_scale = w.w1_scale, t.w3 = w.w3, t.w3_scale = w.w3_scale, t.w2 = w.w2, t.w2_scale = w.w2_scale;
            t.w13_weight_scale_2 = w.w13_weight_scale_2, t.w13_input_scale = w.w13_input_scale;
            t.w2_weight_scale_2 = w.w2_weight_scale_2, t.w2_input_scale = w.w2_input_scale;
        } else {
            const moe_expert &w = layer.experts[size_t(e)];
            if (w.w1 && w.w2 && w.w3 &&
                (!w.w1_scale || !w.w2_scale || !w.w3_scale || !aligned(w.w1, 16) || !aligned(w.w2, 16) || !aligned(w.w3, 16)))
                return Status::invalid_argument(what + ": weights must be 16-byte aligned and their scales set");
            t.w1 = w.w1, t.w1_scale = w.w1_scale, t.w3 = w.w3, t.w3_scale = w.w3_scale, t.w2 = w.w2, t.w2_scale = w.w2_scale;
        }
    }
    void *dst = table_memory;
    if (!dst) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&dst, moe_routed_table_bytes(E)));
        plan.owned_table = std::shared_ptr<void>(dst, [](void *q) { cudaFree(q); });
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, table.data(), table.size() * sizeof(moe_routed_expert), cudaMemcpyHostToDevice));
    plan.table = static_cast<const moe_routed_expert *>(dst);

    if (nvfp4) {
        allow_smem(moe_routed_nvfp4_kernel<1>);
        allow_smem(moe_routed_nvfp4_kernel<2>);
    } else {
        allow_smem(moe_routed_mxfp4_kernel<false, 1>);
        allow_smem(moe_routed_mxfp4_kernel<false, 2>);
        allow_smem(moe_routed_mxfp4_kernel<true, 1>);
        allow_smem(moe_routed_mxfp4_kernel<true, 1, true>);
        allow_smem(moe_routed_mxfp4_kernel<true, 2>);
    }
    return plan;
}

Status run_moe_routed(const moe_routed_plan &plan, const float *x, const int32_t *ids, const float *weights,
                      float *out, void *workspace, cudaStream_t stream, const gemv_split *x_split) {
    if (!x || !ids || !weights || !out || !workspace || !plan.table)
        return Status::invalid_argument("moe routed: x, ids, weights, out, workspace and the plan's table must be set");
    if (x_split && (!x_split->xs || !x_split->sx))
        return Status::invalid_argument("moe routed: a split x needs its codes and its scales");
    if (reinterpret_cast<uintptr_t>(x) % 16) return Status::invalid_argument("moe routed: x must be 16-byte aligned");
    if (static_cast<const void *>(out) == static_cast<const void *>(x))
        return Status::invalid_argument("moe routed: out must not alias x");
    char *ws = static_cast<char *>(workspace);
    routed_params p{};
    p.table = plan.table;
    p.E = plan.E, p.B = plan.B, p.K = plan.K, p.D = plan.D, p.I = plan.I, p.act_block = plan.act_block;
    p.max_rows = 8 * plan.nt;
    p.limit = plan.swiglu_limit, p.weight_after = plan.weight_after_w2;
    p.r = routing_at(ws + plan.off_routing, plan.B, plan.K, plan.u_max);
    p.x = x, p.out = out, p.ids = ids, p.weights = weights;
    // x's split from its producer: the up GEMV's x at one row of official numerics (the split
    // kernel's per-slot copies would all be that row's bits).
    const bool given = x_split && plan.B == 1 && !plan.nvfp4 && plan.act_block;
    p.x_split = given;
    p.xs_up = given ? x_split->xs : reinterpret_cast<uint8_t *>(ws + plan.off_xs_up);
    p.xs_down = reinterpret_cast<uint8_t *>(ws + plan.off_xs_down);
    p.sx_up = given ? x_split->sx : reinterpret_cast<float *>(ws + plan.off_sx_up);
    p.sx_down = reinterpret_cast<float *>(ws + plan.off_sx_down);
    p.gate = reinterpret_cast<float *>(ws + plan.off_gate);
    p.up = reinterpret_cast<float *>(ws + plan.off_up);
    p.h = reinterpret_cast<float *>(ws + plan.off_h);
    p.ye = reinterpret_cast<float *>(ws + plan.off_ye);
    p.counters_up = reinterpret_cast<unsigned *>(ws + plan.off_counters_up);
    p.counters_down = reinterpret_cast<unsigned *>(ws + plan.off_counters_down);
    p.partials_up = reinterpret_cast<float *>(ws + plan.off_partials_up);
    p.partials_down = reinterpret_cast<float *>(ws + plan.off_partials_down);
    std::copy(&plan.ksplit_up[0][0], &plan.ksplit_up[0][0] + 2 * (MOE_MAX_ROUTES + 1), &p.ksplit_up[0][0]);
    std::copy(&plan.ksplit_down[0][0], &plan.ksplit_down[0][0] + 2 * (MOE_MAX_ROUTES + 1), &p.ksplit_down[0][0]);

    const int R = plan.B * plan.K;
    const int mode = plan.nvfp4 ? NVFP4 : plan.act_block ? OFFICIAL : REFERENCE;
    auto split = [&]() {
        const dim3 grid(unsigned(plan.split_blocks_up), unsigned(R));
        const unsigned threads = plan.nvfp4 ? nd::QUANT_THREADS : 256;
        if (mode == NVFP4) (void)launch_pdl(moe_routed_split_kernel<NVFP4>, grid, threads, 0, stream, p);
        else if (mode == OFFICIAL) (void)launch_pdl(moe_routed_split_kernel<OFFICIAL>, grid, threads, 0, stream, p);
        else (void)launch_pdl(moe_routed_split_kernel<REFERENCE>, grid, threads, 0, stream, p);
    };
    // Both token-tile instances for plans of more than 8 rows (the top of the file says why);
    // at C16 almost every step's groups have <= 8 rows and run the one-tile kernel.
    auto gemv = [&](bool down) {
        const unsigned grid = unsigned(std::max(1, down ? plan.down_blocks : plan.up_blocks));
        const unsigned threads = WARPS * 32;
        for (int nt = 1; nt <= plan.nt; nt++) {
            if (plan.nvfp4) {
                if (nt == 1) (void)launch_pdl(moe_routed_nvfp4_kernel<1>, grid, threads, 0, stream, p, down);
                else (void)launch_pdl(moe_routed_nvfp4_kernel<2>, grid, threads, 0, stream, p, down);
            } else if (plan.act_block) {
                if (nt == 1 && plan.B == 1 && gd::one_token_instance(true))
                    (void)launch_pdl(moe_routed_mxfp4_kernel<true, 1, true>, grid, threads, gd::SMEM_BYTES, stream, p, down);
                else if (nt == 1)
                    (void)launch_pdl(moe_routed_mxfp4_kernel<true, 1>, grid, threads, gd::SMEM_BYTES, stream, p, down);
                else (void)launch_pdl(moe_routed_mxfp4_kernel<true, 2>, grid, threads, gd::SMEM_BYTES, stream, p, down);
            } else {
                if (nt == 1)
                    (void)launch_pdl(moe_routed_mxfp4_kernel<false, 1>, grid, threads, gd::SMEM_BYTES, stream, p, down);
                else (void)launch_pdl(moe_routed_mxfp4_kernel<false, 2>, grid, threads, gd::SMEM_BYTES, stream, p, down);
            }
        }
    };

    (void)launch_pdl(moe_routed_group_kernel, 1, GROUP_THREADS, 0, stream, p);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (!given) split();
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    gemv(false);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    static_assert(nd::QUANT_THREADS == 256, "the SwiGLU + split kernel quantizes NVFP4 rows with 256 threads");
    static_assert(SWIGLU_CHUNK % 128 == 0, "a SwiGLU chunk must hold whole activation blocks (32 or 128)");
    const int chunk = mode == NVFP4 ? plan.I : SWIGLU_CHUNK;
    const dim3 sgrid(unsigned((plan.I + chunk - 1) / chunk), unsigned(R));
    const bool before = !plan.weight_after_w2;
    if (mode == NVFP4) (void)launch_pdl(moe_routed_swiglu_kernel<NVFP4>, sgrid, 256, 0, stream, p, before, chunk);
    else if (mode == OFFICIAL)
        (void)launch_pdl(moe_routed_swiglu_kernel<OFFICIAL>, sgrid, 256, 0, stream, p, before, chunk);
    else (void)launch_pdl(moe_routed_swiglu_kernel<REFERENCE>, sgrid, 256, 0, stream, p, before, chunk);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    gemv(true);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const dim3 cgrid(unsigned((plan.D + 255) / 256), unsigned(plan.B));
    if (mode == OFFICIAL) (void)launch_pdl(moe_routed_combine_kernel<true>, cgrid, 256, 0, stream, p);
    else (void)launch_pdl(moe_routed_combine_kernel<false>, cgrid, 256, 0, stream, p);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

namespace {

// One thread: 8 bytes read, 4 written; a launch's latency.
__global__ void moe_routed_flag_kernel(const int *err, int32_t *word, int32_t fail_value) {
    if (err[ERR_HELD] || err[ERR_ROWS]) *word = fail_value;
}

}  // namespace

Status moe_routed_flag_error(const moe_routed_plan &plan, const void *workspace, int32_t *word, int32_t fail_value,
                             cudaStream_t stream) {
    if (!workspace || !word) return Status::invalid_argument("moe_routed_flag_error: null workspace or word");
    const int *err = reinterpret_cast<const int *>(static_cast<const char *>(workspace) + plan.off_routing);
    moe_routed_flag_kernel<<<1, 1, 0, stream>>>(err, word, fail_value);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

static_assert(MOE_ROUTED_ERROR_WORDS == ERR_WORDS, "the header's error word count");

Status moe_routed_error_copy(const moe_routed_plan &plan, void *workspace, int32_t *host_words, cudaStream_t stream) {
    return stage_error_words(static_cast<char *>(workspace) + plan.off_routing, ERR_WORDS, host_words, stream);
}

Status moe_routed_error(const moe_routed_plan &plan, void *workspace, cudaStream_t stream) {
    int32_t err[ERR_WORDS] = {};
    DS41RT_RETURN_IF_ERROR(moe_routed_error_copy(plan, workspace, err, stream));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return moe_routed_error_status(plan, err);
}

Status moe_routed_error_status(const moe_routed_plan &plan, const int32_t *err) {
    if (err[ERR_HELD])
        return Status::invalid_argument("moe routed: a route names expert " + std::to_string(err[ERR_HELD_ID]) +
                                        ", which is not held here (table of " + std::to_string(plan.E) + ")");
    if (err[ERR_ROWS])
        return Status::not_supported("moe routed: expert " + std::to_string(err[ERR_ROWS_ID]) + " has more than " +
                                     std::to_string(8 * plan.nt) + " routes in one step of " + std::to_string(plan.B) +
                                     " rows (a row repeats it); the step's output is zero");
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
