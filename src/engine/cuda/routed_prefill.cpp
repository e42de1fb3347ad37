#include "engine/cuda/routed_prefill.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemm_fp8.cuh"
#include "backend/cuda/nvfp4_gemv.cuh"
#include "backend/cuda/swiglu.cuh"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;
using backend::cpu::lin;

Result<backend::cpu::route_table> routes_to_host(const device_model &m, const int32_t *ids, const float *wts, int64_t S,
                                                 int K) {
    std::vector<int32_t> ih(static_cast<size_t>(S * K));
    std::vector<float> wh(static_cast<size_t>(S * K));
    DS41RT_RETURN_IF_ERROR(m.to_host_pair(ih.data(), ids, ih.size() * sizeof(int32_t), wh.data(), wts, wh.size() * sizeof(float)));
    return backend::cpu::route_table_from(ih.data(), wh.data(), S, K);
}

namespace {

// NVFP4 products in runs of RUN_MATS matrices sharing one workspace (each run's quantized x, K
// slices and counters), zeroed before each run: the next run's layout is its own.
constexpr size_t RUN_MATS = 96;

Status run_nvfp4(const device_model &m, const std::vector<cuda::nvfp4_matrix> &mats, const char *what) {
    std::optional<section_scope> timed;
    if (section_timer *t = m.product_timer(); t && !mats.empty()) {
        double bytes = 0, flops = 0;  // each weight once (E2M1 codes, an E4M3 scale per 16)
        int64_t rows = 0;
        std::set<const void *> weights;
        for (const cuda::nvfp4_matrix &a : mats) {
            const double nk = double(a.N) * a.K;
            bytes += (weights.insert(a.w).second ? nk / 2 + nk / 16 : 0) + double(a.M) * (a.K + a.N) * sizeof(float);
            flops += 2.0 * a.M * nk;
            rows += a.M;
        }
        timed.emplace(*t, std::string(what) + " [nvfp4 gemv pieces, " + std::to_string(rows) + " rows]", m.stream(), bytes,
                      flops);
    }
    std::vector<cuda::nvfp4_gemv_plan> plans;
    size_t bytes = 256;
    for (size_t i = 0; i < mats.size(); i += RUN_MATS) {
        auto plan = cuda::plan_nvfp4_gemv(
            m.device(), std::vector<cuda::nvfp4_matrix>(mats.begin() + long(i), mats.begin() + long(std::min(mats.size(), i + RUN_MATS))));
        if (!plan) return plan.status();
        bytes = std::max(bytes, plan->workspace_bytes);
        plans.push_back(std::move(plan.value()));
    }
    dtemp ws = m.temp(bytes);
    for (const cuda::nvfp4_gemv_plan &p : plans) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws.as<void>(), 0, p.workspace_bytes, m.stream()));
        DS41RT_RETURN_IF_ERROR(cuda::run_nvfp4_gemv(p, ws.as<void>(), m.stream()));
    }
    return Status::ok();
}

// Rows an expert must average for the grouped GEMM to beat the GEMV pieces. The grouped kernel's
// blocks read and decode each expert's MXFP4 once per 256 rows at ~0.5 TB/s of weight bytes
// whatever the rows (its MMAs skip a tile's padding halves), the pieces read each expert once per
// 16 of its rows at ~0.9 TB/s. H100 (session 22, V4.1 8 layers, the bench's weight products): at
// 2048 tokens (32 rows an expert) 99 ms in GEMV pieces, 131 grouped; at 4096 (64 rows) 180 and
// 142: the lines cross near 46 rows (session 12, before the padding skip: near 88).
// DS41RT_GROUPED_MIN_ROWS overrides it (tests take the grouped path on small fixtures with 1).
int64_t grouped_min_rows() {
    const char *e = std::getenv("DS41RT_GROUPED_MIN_ROWS");
    return e && *e ? std::max<int64_t>(1, std::atoll(e)) : 48;
}

// One projection of every expert (jobs of one shape) as one grouped product on the tensor cores
// (backend/cuda gemm_fp8, official numerics, experts of grouped_min_rows() rows or more on
// average); else, or where that kernel cannot run, the GEMV pieces (run_grouped). The same
// numerics class either way (x fake-quantized per fp8_block_in, exact products, bf16 outputs),
// another fp32 summation order.
// what: the projection's name in the product timer's label.
Status run_experts(const device_model &m, const std::vector<device_model::grouped_job> &jobs, const float *x, int64_t R,
                   const char *what) {
    if (jobs.empty()) return Status::ok();
    int64_t rows = 0;
    for (const device_model::grouped_job &j : jobs) rows += j.M;
    const bool grouped = m.official() && m.prefill_gemm() && rows >= grouped_min_rows() * int64_t(jobs.size());
    std::optional<section_scope> timed;
    if (section_timer *t = m.product_timer()) {
        product_cost c;
        for (const device_model::grouped_job &j : jobs) c += cost_of(*j.L, j.M);
        timed.emplace(*t, std::string(what) + " [mxfp4 " + (grouped ? "grouped gemm" : "gemv pieces") + ", " +
                              std::to_string(rows) + " rows]",
                      m.stream(), c.bytes, c.flops);
    }
    if (grouped) {
        cuda::gemm_fp8_grouped_args a;
        a.x = x, a.R = R, a.K = jobs[0].L->K, a.N = jobs[0].L->N, a.fp4 = true;
        a.act_block = m.config().fp8_block_in, a.round_bf16 = true;
        for (const device_model::grouped_job &j : jobs) a.groups.push_back({(j.x - x) / a.K, j.M, j.L->w, j.L->scale, j.y});
        dtemp ws = m.temp(cuda::gemm_fp8_grouped_workspace_bytes(a));
        const Status st = cuda::run_gemm_fp8_grouped(m.device(), a, ws.as<void>(), m.stream());
        if (st.code() != status_code::NOT_SUPPORTED) return st;
    }
    return m.run_grouped(jobs, lin::FP4);
}

}  // namespace

Status routed_prefill(const device_model &m, const cuda::moe_layer &moe, const float *x, int64_t S,
                  const backend::cpu::route_table &rt, int K, float *acc) {
    const bool nvfp4 = !moe.nvfp4_experts.empty();
    const int64_t D = moe.D, I = moe.I, E = int64_t(nvfp4 ? moe.nvfp4_experts.size() : moe.experts.size());
    const bool official = m.official();
    cudaStream_t st = m.stream();
    std::vector<std::vector<std::pair<int32_t, float>>> by_expert(static_cast<size_t>(E));
    for (int64_t r = 0; r < S; r++)
        for (uint32_t i = rt.offsets[size_t(r)]; i < rt.offsets[size_t(r) + 1]; i++) {
            if (int64_t(rt.routes[i].expert) >= E)
                return Status::internal("routed prefill: expert " + std::to_string(rt.routes[i].expert) + " of " + std::to_string(E));
            by_expert[rt.routes[i].expert].push_back({int32_t(r), rt.routes[i].weight});
        }
    // The routes sorted by expert (idx: their rows, wts: their weights); pos: each row's
    // routes in that order, which is increasing expert id (the combine's order).
    std::vector<int32_t> idx, pos(static_cast<size_t>(S * K), -1), filled(static_cast<size_t>(S), 0);
    std::vector<float> wts;
    std::vector<int64_t> first(static_cast<size_t>(E) + 1, 0);
    for (int64_t e = 0; e < E; e++) {
        for (auto &[r, w] : by_expert[size_t(e)]) {
            if (filled[size_t(r)] >= K) return Status::internal("routed prefill: a row with more than K routes");
            pos[size_t(r * K + filled[size_t(r)]++)] = int32_t(idx.size());
            idx.push_back(r), wts.push_back(w);
        }
        first[size_t(e) + 1] = int64_t(idx.size());
    }
    const int64_t R = int64_t(idx.size());
    if (R == 0) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, size_t(S * D) * sizeof(float), st));
        return Status::ok();
    }
    auto idx_d = m.upload_temp(idx.data(), idx.size() * sizeof(int32_t));
    auto w_d = m.upload_temp(wts.data(), wts.size() * sizeof(float));
    auto pos_d = m.upload_temp(pos.data(), pos.size() * sizeof(int32_t));
    if (!idx_d) return idx_d.status();
    if (!w_d) return w_d.status();
    if (!pos_d) return pos_d.status();
    // Every expert's rows at once: one gather, the GEMVs of all experts in shared launches
    // (each expert's weights read once per 16 of its rows), one SwiGLU, one combine.
    const bool after = moe.weight_after_w2;
    if (nvfp4) {  // W4A4 (nvfp4_gemv, 16 rows a matrix), the publication's SwiGLU, fp32 outputs
        std::vector<cuda::nvfp4_matrix> up, down;
        dtemp xg = m.temp_f32(R * D), g = m.temp_f32(R * I), u = m.temp_f32(R * I), ye = m.temp_f32(R * D);
        for (int64_t e = 0; e < E; e++) {
            const cuda::moe_nvfp4_expert &w = moe.nvfp4_experts[size_t(e)];
            for (int64_t f = first[size_t(e)]; f < first[size_t(e) + 1]; f += cuda::MOE_MAX_ROWS) {
                if (!w.w1 || !w.w2 || !w.w3) return Status::internal("routed prefill: NVFP4 expert " + std::to_string(e) + " not held");
                cuda::nvfp4_matrix a;
                a.M = int(std::min<int64_t>(cuda::MOE_MAX_ROWS, first[size_t(e) + 1] - f));
                a.N = int(I), a.K = int(D), a.x = xg.f() + f * D;
                a.weight_scale_2 = w.w13_weight_scale_2, a.input_scale = w.w13_input_scale;
                a.w = w.w1, a.scale = w.w1_scale, a.y = g.f() + f * I;
                up.push_back(a);
                a.w = w.w3, a.scale = w.w3_scale, a.y = u.f() + f * I;
                up.push_back(a);
                a.N = int(D), a.K = int(I), a.x = g.f() + f * I;
                a.weight_scale_2 = w.w2_weight_scale_2, a.input_scale = w.w2_input_scale;
                a.w = w.w2, a.scale = w.w2_scale, a.y = ye.f() + f * D;
                down.push_back(a);
            }
        }
        DS41RT_RETURN_IF_ERROR(cuda::gather_rows(x, idx_d->as<int32_t>(), R, D, xg.f(), st));
        DS41RT_RETURN_IF_ERROR(run_nvfp4(m, up, "ffn.experts.w1 + ffn.experts.w3"));
        DS41RT_RETURN_IF_ERROR(cuda::nvfp4_swiglu_rows(g.f(), u.f(), after ? nullptr : w_d->f(), g.f(), R, I, moe.swiglu_limit, st));
        DS41RT_RETURN_IF_ERROR(run_nvfp4(m, down, "ffn.experts.w2"));
        return cuda::sum_routes(acc, ye.f(), pos_d->as<int32_t>(), after ? w_d->f() : nullptr, S, int(K), D, false, st);
    }
    std::vector<dlinear> ws(static_cast<size_t>(3 * E));
    std::vector<device_model::grouped_job> up, down;
    dtemp xg = m.temp_f32(R * D), g = m.temp_f32(R * I), u = m.temp_f32(R * I), ye = m.temp_f32(R * D);
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = first[size_t(e) + 1] - first[size_t(e)];
        if (n == 0) continue;
        const cuda::moe_expert &me = moe.experts[size_t(e)];
        dlinear &w1 = ws[size_t(3 * e)], &w3 = ws[size_t(3 * e + 1)], &w2 = ws[size_t(3 * e + 2)];
        w1.k = w3.k = w2.k = dlinear::kind::MXFP4;
        w1.w = me.w1, w1.scale = me.w1_scale, w3.w = me.w3, w3.scale = me.w3_scale;
        w1.N = w3.N = int(I), w1.K = w3.K = int(D);
        w2.w = me.w2, w2.scale = me.w2_scale, w2.N = int(D), w2.K = int(I);
        const int64_t f = first[size_t(e)];
        up.push_back({&w1, xg.f() + f * D, g.f() + f * I, n});
        up.push_back({&w3, xg.f() + f * D, u.f() + f * I, n});
        down.push_back({&w2, g.f() + f * I, ye.f() + f * D, n});
    }
    DS41RT_RETURN_IF_ERROR(cuda::gather_rows(x, idx_d->as<int32_t>(), R, D, xg.f(), st));
    DS41RT_RETURN_IF_ERROR(run_experts(m, up, xg.f(), R, "ffn.experts.w1 + ffn.experts.w3"));
    DS41RT_RETURN_IF_ERROR(
        cuda::swiglu_rows(g.f(), u.f(), after ? nullptr : w_d->f(), g.f(), R, I, moe.swiglu_limit, official, st));
    DS41RT_RETURN_IF_ERROR(run_experts(m, down, g.f(), R, "ffn.experts.w2"));
    return cuda::sum_routes(acc, ye.f(), pos_d->as<int32_t>(), after ? w_d->f() : nullptr, S, int(K), D, official, st);
}

}  // namespace ds41rt::engine::gpu
