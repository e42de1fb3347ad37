// Routed-expert decode for one MoE layer: gather -> GEMV(w1, w3 of every selected expert) ->
// clamped SwiGLU -> GEMV(w2) -> combine. Reference: backend/cpu routed_expert_sum.
//
// Shapes: x, out [B, D] fp32 row-major; per step R = B x K slot rows of gathered x [R, D], gate,
// up, h [R, I] and expert outputs [R, D] (moe_buffers); weights MXFP4 as gemv_matrix.
//
// Cost at V4.1 decode (no prefill shape: prefill runs grouped GEMMs), per selected expert: MXFP4
// w1 + w3 + w2 with their E8M0 scales, 18.8 MB, read once for all of its rows; 2 * 3 * 2304 *
// 5120 = 70.8 MFLOP per route, ~4 FLOP per weight byte: HBM-bound. B = 1 selects 6 experts
// (113 MB, ~27 us at the H200's ~4.2 TB/s copy rate); B = 16 with uniform routing selects ~85 of
// 384 (~1.6 GB, ~0.38 ms). The three small kernels move R x (2 D + 3 I + D) x 4 bytes (R = B x
// K routes: 1.4 MB at R = 96), under 1% of the weight bytes; their cost is launch latency.
//
// Grouping: routes are sorted by (expert, row, k) into R slots, so an expert's rows are a
// contiguous slab of the slot buffers and one GEMV matrix of M = rows covers them (each expert's
// weights stream once, whatever its M). The combine walks each token row's slots in increasing
// slot index, which is increasing expert id, exactly the CPU accumulation order, with separate
// multiply and add (no FMA contraction) so it reproduces the CPU's fp32 sums bit for bit given
// the same expert outputs.
//
// Numerics (the rounding points of backend/cpu swiglu_expert with official = true): gate and up
// rounded to bf16 (the FP4 matmul's bf16 output), h = silu(min(gate, L)) * clamp(up, -L, L)
// [* weight] rounded to bf16, the GEMV quantizes h to E4M3 per act_block, the expert output is
// rounded to bf16 in the combine before [* weight]. Reference numerics: all fp32.
//
// Why the routing is kernel parameters, not device data: the GEMV takes its jobs (weight
// pointers, M per matrix) as a __grid_constant__ kernel parameter, so which experts a launch
// streams is fixed when it is launched. A device-side grouping (fixed bound of min(B x K, E)
// experts per step) would need the GEMV to read its job table from device memory, a change to
// the GEMV kernel that this file leaves to its owner. The small kernels here take the routing as
// parameters too (about 1.6 KB), so one step is a pure sequence of launches.
//
// NVFP4 layers (moe_layer.nvfp4_experts): the same routing, gather and combine around
// nvfp4_gemv (W4A4: x quantized per 16 with each expert's input_scale; at B = 1 the experts share
// x but not its quantization), the rounding points of backend/cpu nvfp4_w4a4_swiglu (bf16 gate,
// up, silu and h; the expert output stays fp32, so the combine adds it unrounded), the route
// weight applied to h before its W4A4 quantization (weight_after_w2 false) or to the expert
// output (true). Cost per selected expert: 3 x 6.64 MB of codes and scales (0.5625 B per weight),
// 19.9 MB; B = 1 reads 119.5 MB (~28 us at ~4.3 TB/s).
//
// Invariants: B <= 16, R <= 128, D and I multiples of 32, x 16-byte aligned, out != x.
// Graph-capturable: yes, for the routing the plan was built with (STYLE 17 wants routing read
// from device memory; see above for why this first version cannot, and the header for what a
// graph needs). Reduction order fixed (expert id), so results are deterministic.
// Launches per step: gather (B > 1; at B = 1 the experts read x in place), the GEMV's x preparation and ceil(2U / 24) launches for w1 + w3,
// SwiGLU, x preparation and ceil(U / 24) launches for w2, combine (U selected experts).
// Test: tests/cuda/moe_decode_test.cpp (reference numerics: relative error per row <= 1e-5;
// official numerics: see the test for the bound and why).
#include "backend/cuda/moe_decode.cuh"

#include <algorithm>
#include <numeric>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/moe_numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

using namespace moe_detail;

struct routing_params {
    int B, R, D, I;
    int slot_row[MOE_MAX_ROUTES];
    float slot_weight[MOE_MAX_ROUTES];
    int row_off[MOE_MAX_ROWS + 1];
    int row_slot[MOE_MAX_ROUTES];
};

// xg[s] = x[slot_row[s]]: the rows of each expert side by side for its GEMV matrix.
__global__ void moe_decode_gather_kernel(const __grid_constant__ routing_params p,
                                         const float *__restrict__ x,  // [B, D]
                                         float *__restrict__ xg) {     // [R, D]
    const int s = blockIdx.x;
    const float4 *src = reinterpret_cast<const float4 *>(x + size_t(p.slot_row[s]) * p.D);
    float4 *dst = reinterpret_cast<float4 *>(xg + size_t(s) * p.D);
    for (int i = threadIdx.x; i < p.D / 4; i += blockDim.x) dst[i] = src[i];
}

template <int MODE>
__global__ void moe_decode_swiglu_kernel(const __grid_constant__ routing_params p,
                                         const float *__restrict__ gate,  // [R, I] w1 x, fp32
                                         const float *__restrict__ up,    // [R, I] w3 x, fp32
                                         float *__restrict__ h,           // [R, I] w2's input
                                         float limit, bool weight_before) {
    const size_t n = size_t(p.R) * p.I;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        h[i] = swiglu_h<MODE>(gate[i], up[i], limit, weight_before, weight_before ? p.slot_weight[i / size_t(p.I)] : 0.0f);
    }
}

// nvfp4_swiglu_rows: the same arithmetic with a weight per row of a plain [rows, I] layout.
__global__ void nvfp4_swiglu_rows_kernel(const float *__restrict__ gate, const float *__restrict__ up,
                                         const float *__restrict__ row_weight, float *__restrict__ h, int64_t rows,
                                         int64_t inter, float limit) {
    const size_t n = size_t(rows) * size_t(inter);
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        h[i] = swiglu_h<NVFP4>(gate[i], up[i], limit, row_weight != nullptr,
                               row_weight ? row_weight[i / size_t(inter)] : 0.0f);
}

template <bool OFFICIAL>
__global__ void moe_decode_combine_kernel(const __grid_constant__ routing_params p,
                                          const float *__restrict__ ye,  // [R, D] w2 h, fp32
                                          float *__restrict__ out,       // [B, D]
                                          bool weight_after) {
    const int b = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= p.D) return;
    float acc = 0.0f;
    for (int j = p.row_off[b]; j < p.row_off[b + 1]; j++) {
        const int s = p.row_slot[j];
        acc = __fadd_rn(acc, combine_term<OFFICIAL>(ye[size_t(s) * p.D + d], weight_after, p.slot_weight[s]));
    }
    out[size_t(b) * p.D + d] = acc;
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

size_t moe_buffer_bytes(int D, int I, int routes) {
    const size_t R = size_t(routes);
    return 2 * align256(R * D * 4) + 3 * align256(R * I * 4);
}

moe_buffers moe_buffers_at(void *base, int D, int I, int routes) {
    const size_t R = size_t(routes);
    char *p = static_cast<char *>(base);
    moe_buffers b;
    b.xg = reinterpret_cast<float *>(p), p += align256(R * D * 4);
    b.gate = reinterpret_cast<float *>(p), p += align256(R * I * 4);
    b.up = reinterpret_cast<float *>(p), p += align256(R * I * 4);
    b.h = reinterpret_cast<float *>(p), p += align256(R * I * 4);
    b.ye = reinterpret_cast<float *>(p);
    return b;
}

Result<moe_decode_plan> plan_moe_decode(const device_info &dev, const moe_layer &layer, const moe_buffers &buf,
                                        const float *x, float *out, const std::vector<moe_route> &routes, int B,
                                        int K) {
    const int D = layer.D, I = layer.I;
    if (B < 1 || B > MOE_MAX_ROWS || K < 1 || B * K > MOE_MAX_ROUTES)
        return Status::not_supported("moe decode: " + std::to_string(B) + " rows x " + std::to_string(K) +
                                     " routes (at most " + std::to_string(MOE_MAX_ROWS) + " rows, " +
                                     std::to_string(MOE_MAX_ROUTES) + " routes)");
    if (routes.size() != size_t(B) * K)
        return Status::invalid_argument("moe decode: " + std::to_string(routes.size()) + " routes for " +
                                        std::to_string(B) + " rows x " + std::to_string(K));
    if (D <= 0 || I <= 0 || D % 32 || I % 32)
        return Status::not_supported("moe decode: D " + std::to_string(D) + " and I " + std::to_string(I) +
                                     " must be positive multiples of 32");
    if (!x || !out || !buf.xg || !buf.gate || !buf.up || !buf.h || !buf.ye || reinterpret_cast<uintptr_t>(x) % 16)
        return Status::invalid_argument("moe decode: x, out and the step buffers must be set, x 16-byte aligned");
    if (static_cast<const void *>(out) == static_cast<const void *>(x))
        return Status::invalid_argument("moe decode: out must not alias x");
    const bool nvfp4 = !layer.nvfp4_experts.empty();
    auto held = [&](uint32_t e) {
        if (nvfp4)
            return e < layer.nvfp4_experts.size() && layer.nvfp4_experts[e].w1 && layer.nvfp4_experts[e].w2 &&
                   layer.nvfp4_experts[e].w3;
        return e < layer.experts.size() && layer.experts[e].w1 && layer.experts[e].w2 && layer.experts[e].w3;
    };
    for (int r = 0; r < B * K; r++) {
        const uint32_t e = routes[size_t(r)].expert;
        if (!held(e))
            return Status::invalid_argument("moe decode: row " + std::to_string(r / K) + " routes to expert " +
                                            std::to_string(e) + ", which is not held here");
    }

    moe_decode_plan plan;
    plan.B = B, plan.R = B * K, plan.D = D, plan.I = I;
    plan.act_block = nvfp4 ? 0 : layer.act_block, plan.swiglu_limit = layer.swiglu_limit;
    plan.nvfp4 = nvfp4;
    plan.weight_after_w2 = layer.weight_after_w2;
    plan.x = x, plan.out = out, plan.buf = buf;

    // Slots in (expert, row, k) order: routes are listed row-major, so a stable sort on the
    // expert alone keeps rows (and a row's repeated routes) in listing order, as the CPU does.
    std::vector<int> order(size_t(plan.R));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return routes[size_t(a)].expert < routes[size_t(b)].expert; });
    plan.slot_row.resize(size_t(plan.R));
    plan.slot_weight.resize(size_t(plan.R));
    plan.slot_expert.resize(size_t(plan.R));
    std::vector<int> slot_of(size_t(plan.R));
    for (int s = 0; s < plan.R; s++) {
        plan.slot_row[size_t(s)] = order[size_t(s)] / K;
        plan.slot_weight[size_t(s)] = routes[size_t(order[size_t(s)])].weight;
        plan.slot_expert[size_t(s)] = routes[size_t(order[size_t(s)])].expert;
        slot_of[size_t(order[size_t(s)])] = s;
    }
    plan.row_off.assign(size_t(B) + 1, 0);
    for (int b = 0; b < B; b++) {
        plan.row_off[size_t(b) + 1] = (b + 1) * K;
        std::vector<int> mine(slot_of.begin() + b * K, slot_of.begin() + (b + 1) * K);
        std::sort(mine.begin(), mine.end());  // increasing slot = increasing expert id
        plan.row_slot.insert(plan.row_slot.end(), mine.begin(), mine.end());
    }

    std::vector<gemv_matrix> up, down;
    std::vector<nvfp4_matrix> up4, down4;
    for (int s0 = 0; s0 < plan.R;) {
        const uint32_t e = routes[size_t(order[size_t(s0)])].expert;
        int s1 = s0;
        while (s1 < plan.R && routes[size_t(order[size_t(s1)])].expert == e) s1++;
        if (s1 - s0 > MOE_MAX_ROWS)
            return Status::not_supported("moe decode: expert " + std::to_string(e) + " has " +
                                         std::to_string(s1 - s0) + " routes in one step (at most 16)");
        plan.experts_read++;
        if (nvfp4) {
            const moe_nvfp4_expert &w = layer.nvfp4_experts[e];
            nvfp4_matrix m;
            m.M = s1 - s0, m.N = I, m.K = D, m.x = B == 1 ? x : buf.xg + size_t(s0) * D;
            m.weight_scale_2 = w.w13_weight_scale_2, m.input_scale = w.w13_input_scale;
            m.w = w.w1, m.scale = w.w1_scale, m.y = buf.gate + size_t(s0) * I;
            up4.push_back(m);
            m.w = w.w3, m.scale = w.w3_scale, m.y = buf.up + size_t(s0) * I;
            up4.push_back(m);
            m.N = D, m.K = I, m.x = buf.h + size_t(s0) * I;
            m.weight_scale_2 = w.w2_weight_scale_2, m.input_scale = w.w2_input_scale;
            m.w = w.w2, m.scale = w.w2_scale, m.y = buf.ye + size_t(s0) * D;
            down4.push_back(m);
            s0 = s1;
            continue;
        }
        const moe_expert &w = layer.experts[e];
        gemv_matrix m;
        m.fp4 = true, m.act_block = layer.act_block, m.M = s1 - s0;
        // One row: every expert reads x itself, no gather, and the GEMV prepares x once for all.
        m.N = I, m.K = D, m.x = B == 1 ? x : buf.xg + size_t(s0) * D;
        m.w = w.w1, m.scale = w.w1_scale, m.y = buf.gate + size_t(s0) * I;
        up.push_back(m);
        m.w = w.w3, m.scale = w.w3_scale, m.y = buf.up + size_t(s0) * I;
        up.push_back(m);
        m.N = D, m.K = I, m.x = buf.h + size_t(s0) * I;
        m.w = w.w2, m.scale = w.w2_scale, m.y = buf.ye + size_t(s0) * D;
        down.push_back(m);
        s0 = s1;
    }
    if (nvfp4) {
        auto pu = plan_nvfp4_gemv(dev, up4);
        if (!pu) return pu.status();
        auto pd = plan_nvfp4_gemv(dev, down4);
        if (!pd) return pd.status();
        plan.up4 = std::move(pu.value());
        plan.down4 = std::move(pd.value());
        plan.down_offset = align256(plan.up4.workspace_bytes);
        plan.workspace_bytes = plan.down_offset + std::max<size_t>(plan.down4.workspace_bytes, 1);
        return plan;
    }
    auto pu = plan_gemv(dev, up);
    if (!pu) return pu.status();
    auto pd = plan_gemv(dev, down);
    if (!pd) return pd.status();
    plan.up = std::move(pu.value());
    plan.down = std::move(pd.value());
    // Separate regions: each GEMV plan's split-K counters must find zeros where its own layout
    // puts them, and the other plan's partials would land there in a shared region.
    plan.down_offset = align256(plan.up.workspace_bytes);
    plan.workspace_bytes = plan.down_offset + std::max<size_t>(plan.down.workspace_bytes, 1);
    return plan;
}

Status run_moe_decode(const moe_decode_plan &plan, void *workspace, cudaStream_t stream) {
    routing_params p{};
    p.B = plan.B, p.R = plan.R, p.D = plan.D, p.I = plan.I;
    std::copy(plan.slot_row.begin(), plan.slot_row.end(), p.slot_row);
    std::copy(plan.slot_weight.begin(), plan.slot_weight.end(), p.slot_weight);
    std::copy(plan.row_off.begin(), plan.row_off.end(), p.row_off);
    std::copy(plan.row_slot.begin(), plan.row_slot.end(), p.row_slot);
    const bool official = plan.act_block != 0;

    if (plan.B > 1) {
        moe_decode_gather_kernel<<<plan.R, 256, 0, stream>>>(p, plan.x, plan.buf.xg);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    char *down_ws = static_cast<char *>(workspace) + plan.down_offset;
    if (plan.nvfp4)
        DS41RT_RETURN_IF_ERROR(run_nvfp4_gemv(plan.up4, workspace, stream));
    else
        DS41RT_RETURN_IF_ERROR(run_gemv(plan.up, workspace, stream));
    const size_t n = size_t(plan.R) * plan.I;
    const unsigned grid = unsigned(std::min<size_t>((n + 255) / 256, 4096));
    const bool before = !plan.weight_after_w2;
    if (plan.nvfp4)
        moe_decode_swiglu_kernel<NVFP4><<<grid, 256, 0, stream>>>(p, plan.buf.gate, plan.buf.up, plan.buf.h, plan.swiglu_limit, before);
    else if (official)
        moe_decode_swiglu_kernel<OFFICIAL><<<grid, 256, 0, stream>>>(p, plan.buf.gate, plan.buf.up, plan.buf.h, plan.swiglu_limit, before);
    else
        moe_decode_swiglu_kernel<REFERENCE><<<grid, 256, 0, stream>>>(p, plan.buf.gate, plan.buf.up, plan.buf.h, plan.swiglu_limit, before);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (plan.nvfp4)
        DS41RT_RETURN_IF_ERROR(run_nvfp4_gemv(plan.down4, down_ws, stream));
    else
        DS41RT_RETURN_IF_ERROR(run_gemv(plan.down, down_ws, stream));
    const dim3 cgrid(unsigned((plan.D + 255) / 256), unsigned(plan.B));
    if (official)
        moe_decode_combine_kernel<true><<<cgrid, 256, 0, stream>>>(p, plan.buf.ye, plan.out, plan.weight_after_w2);
    else
        moe_decode_combine_kernel<false><<<cgrid, 256, 0, stream>>>(p, plan.buf.ye, plan.out, plan.weight_after_w2);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status nvfp4_swiglu_rows(const float *gate, const float *up, const float *row_weight, float *h, int64_t rows,
                         int64_t inter, float limit, cudaStream_t stream) {
    if (rows <= 0 || inter <= 0) return Status::ok();
    const size_t n = size_t(rows) * size_t(inter);
    const unsigned grid = unsigned(std::min<size_t>((n + 255) / 256, 4096));
    nvfp4_swiglu_rows_kernel<<<grid, 256, 0, stream>>>(gate, up, row_weight, h, rows, inter, limit);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status reset_moe_workspace(const moe_decode_plan &plan, void *workspace, cudaStream_t stream) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(workspace, 0, plan.workspace_bytes, stream));
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
