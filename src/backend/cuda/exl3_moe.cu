// Launches per call: one gather, the gate / up products of every selected expert together
// (exl3_gemv runs of up to 96 matrices, 24 a launch), one SwiGLU, the down products likewise, and
// one scatter-add per selected expert (a scatter's rows must be distinct; an expert's are).
// Bytes: each selected expert's trellis is read once per 16 of its rows (exl3_gemv takes at most
// 16 rows a matrix), at V4.1's K = 2 about 3 x 2.95 MB an expert.
#include "backend/cuda/exl3_moe.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/fake_quant.cuh"
#include "backend/cuda/swiglu.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int64_t GEMV_ROWS = 16;  // exl3_gemv's rows per matrix

exl3_matrix matrix_of(const exl3_linear_dev &w, const float *x, float *y, int64_t M) {
    exl3_matrix m;
    m.trellis = w.trellis;
    m.suh = w.suh;
    m.svh = w.svh;
    m.in = int(w.in);
    m.out = int(w.out);
    m.k = w.k;
    m.cb = w.cb;
    m.x = x;
    m.y = y;
    m.M = int(M);
    return m;
}

// Every matrix of one product step, in runs of at most RUN_MATS matrices that share one
// workspace (a prefill's hundreds of matrices would otherwise hold a rotated x each at once:
// in x 64 B, 0.33 MB per V4.1 w1). Zeroed before each run: a run leaves its own counters at
// zero, but the next run's layout may put its counters where this one kept partials or x.
constexpr size_t RUN_MATS = 96;

Status run_gemvs(const device_info &dev, const std::vector<exl3_matrix> &mats, const exl3_scratch &scratch,
                 cudaStream_t st) {
    std::vector<exl3_plan> plans;
    size_t ws_bytes = 256;
    for (size_t i = 0; i < mats.size(); i += RUN_MATS) {
        const std::vector<exl3_matrix> part(mats.begin() + long(i), mats.begin() + long(std::min(mats.size(), i + RUN_MATS)));
        auto plan = plan_exl3_gemv(dev, part);
        if (!plan) return plan.status();
        ws_bytes = std::max(ws_bytes, plan->workspace_bytes);
        plans.push_back(std::move(plan.value()));
    }
    auto ws = scratch(ws_bytes);
    if (!ws) return ws.status();
    for (const exl3_plan &p : plans) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(*ws, 0, p.workspace_bytes, st));
        DS41RT_RETURN_IF_ERROR(run_exl3_gemv(p, *ws, st));
    }
    return Status::ok();
}

// `bytes` of scratch holding a copy of host (pageable: copied before the call returns).
Result<void *> upload(const exl3_scratch &scratch, const void *host, size_t bytes, cudaStream_t st) {
    auto d = scratch(bytes);
    if (!d) return d.status();
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(*d, host, bytes, cudaMemcpyHostToDevice, st));
    return d;
}

}  // namespace

Status exl3_routed_sum(const device_info &dev, const std::vector<exl3_expert_dev> &experts,
                       const cpu::expert_numerics &nm, const float *x, int64_t D, const cpu::route_table &rt,
                       float *acc, const exl3_scratch &scratch, cudaStream_t st) {
    const int64_t S = rt.rows(), E = int64_t(experts.size());
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, size_t(S * D) * sizeof(float), st));
    // Rows grouped by expert, experts in increasing id (routed_expert_sum's order).
    std::vector<std::vector<std::pair<int32_t, float>>> by_expert(static_cast<size_t>(E));
    for (int64_t r = 0; r < S; r++)
        for (uint32_t i = rt.offsets[size_t(r)]; i < rt.offsets[size_t(r) + 1]; i++) {
            const cpu::route &ro = rt.routes[i];
            if (int64_t(ro.expert) >= E || !experts[ro.expert].w1.trellis)
                return Status::invalid_argument("EXL3 routed experts: row " + std::to_string(r) + " routes to expert " +
                                                std::to_string(ro.expert) + ", which is not held here");
            auto &rows = by_expert[ro.expert];
            if (!rows.empty() && rows.back().first == int32_t(r))  // a scatter's rows must be distinct
                return Status::invalid_argument("EXL3 routed experts: row " + std::to_string(r) + " routes to expert " +
                                                std::to_string(ro.expert) + " twice");
            rows.push_back({int32_t(r), ro.weight});
        }
    std::vector<int32_t> idx;
    std::vector<float> wts;
    std::vector<int64_t> first(static_cast<size_t>(E) + 1, 0);
    int64_t I = 0;
    for (int64_t e = 0; e < E; e++) {
        if (!by_expert[size_t(e)].empty()) {
            const exl3_expert_dev &x3 = experts[size_t(e)];
            if (I == 0) I = x3.w1.out;
            if (x3.w1.in != D || x3.w3.in != D || x3.w1.out != I || x3.w3.out != I || x3.w2.in != I || x3.w2.out != D)
                return Status::invalid_argument(
                    "EXL3 routed expert " + std::to_string(e) + ": w1 / w3 [" + std::to_string(x3.w1.out) + ", " +
                    std::to_string(x3.w1.in) + "], w2 [" + std::to_string(x3.w2.out) + ", " + std::to_string(x3.w2.in) +
                    "] do not fit dim " + std::to_string(D) + " and the layer's intermediate " + std::to_string(I));
        }
        for (auto &[r, w] : by_expert[size_t(e)]) idx.push_back(r), wts.push_back(w);
        first[size_t(e) + 1] = int64_t(idx.size());
    }
    const int64_t R = int64_t(idx.size());
    if (R == 0) return Status::ok();
    auto idx_up = upload(scratch, idx.data(), idx.size() * sizeof(int32_t), st);
    if (!idx_up) return idx_up.status();
    auto w_up = upload(scratch, wts.data(), wts.size() * sizeof(float), st);
    if (!w_up) return w_up.status();
    const int32_t *idx_d = static_cast<const int32_t *>(*idx_up);
    const float *w_d = static_cast<const float *>(*w_up);
    const bool off = nm.official, after = nm.weight_after_w2;

    // x of every route, in expert order; OFFICIAL's FP8 activation quantization is per row, so
    // quantizing the gathered rows is quantizing x.
    auto bufs = scratch(size_t(R * D + 2 * R * I + R * D) * sizeof(float));
    if (!bufs) return bufs.status();
    float *xg = static_cast<float *>(*bufs), *g = xg + R * D, *u = g + R * I, *ye = u + R * I;
    DS41RT_RETURN_IF_ERROR(gather_rows(x, idx_d, R, D, xg, st));
    if (off) DS41RT_RETURN_IF_ERROR(fake_quant_fp8_ue8m0(xg, R, D, nm.act_block, st));

    // The selected experts' w1 and w3 on their rows, 16 rows a matrix, all in run_gemvs.
    auto chunks = [&](auto &&add) {
        for (int64_t e = 0; e < E; e++)
            for (int64_t r0 = first[size_t(e)]; r0 < first[size_t(e) + 1]; r0 += GEMV_ROWS)
                add(experts[size_t(e)], r0, std::min(GEMV_ROWS, first[size_t(e) + 1] - r0));
    };
    std::vector<exl3_matrix> mats;
    chunks([&](const exl3_expert_dev &w, int64_t r0, int64_t n) {
        mats.push_back(matrix_of(w.w1, xg + r0 * D, g + r0 * I, n));
        mats.push_back(matrix_of(w.w3, xg + r0 * D, u + r0 * I, n));
    });
    DS41RT_RETURN_IF_ERROR(run_gemvs(dev, mats, scratch, st));
    if (off) DS41RT_RETURN_IF_ERROR(round_bf16_inplace(g, 2 * R * I, st));  // the FP4 class's bf16 outputs (g and u)

    // h = weight * SwiGLU(g, u) (bf16 when OFFICIAL), into g; OFFICIAL quantizes it for w2.
    DS41RT_RETURN_IF_ERROR(swiglu_rows(g, u, after ? nullptr : w_d, g, R, I, nm.swiglu_limit, off, st));
    if (off) DS41RT_RETURN_IF_ERROR(fake_quant_fp8_ue8m0(g, R, I, nm.act_block, st));

    mats.clear();
    chunks([&](const exl3_expert_dev &w, int64_t r0, int64_t n) {
        mats.push_back(matrix_of(w.w2, g + r0 * I, ye + r0 * D, n));
    });
    DS41RT_RETURN_IF_ERROR(run_gemvs(dev, mats, scratch, st));

    // Each expert's outputs (bf16 when OFFICIAL, then the weight when after w2) onto its rows:
    // expert by expert, so every row adds its routes in increasing expert id.
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = first[size_t(e) + 1] - first[size_t(e)];
        if (n == 0) continue;
        DS41RT_RETURN_IF_ERROR(scatter_add_rows(acc, ye + first[size_t(e)] * D, idx_d + first[size_t(e)],
                                                after ? w_d + first[size_t(e)] : nullptr, n, D, off, st));
    }
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
