// Launches per call: one gather, the gate / up products of every selected expert together
// (exl3_gemv runs of up to 96 matrices, 24 a launch), one SwiGLU, the down products likewise, and
// one scatter-add per selected expert (a scatter's rows must be distinct; an expert's are).
// Bytes: each selected expert's trellis is read once per 16 of its rows (exl3_gemv takes at most
// 16 rows a matrix), at V4.1's K = 2 about 3 x 2.95 MB an expert.
#include "engine/cuda/exl3_experts.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/exl3_gemv.cuh"
#include "backend/cuda/fake_quant.cuh"
#include "backend/cuda/swiglu.cuh"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;

namespace {

constexpr int64_t GEMV_ROWS = 16;  // exl3_gemv's rows per matrix

cuda::exl3_matrix matrix_of(const device_model::exl3_dev &w, const float *x, float *y, int64_t M) {
    cuda::exl3_matrix m;
    m.trellis = w.trellis;
    m.suh = w.suh;
    m.svh = w.svh;
    m.in = int(w.in);
    m.out = int(w.out);
    m.k = w.k;
    m.cb = cuda::exl3_cb(int(w.cb));  // the same numbering (exllamav3's)
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

Status run_gemvs(const device_model &m, const std::vector<cuda::exl3_matrix> &mats) {
    std::vector<cuda::exl3_plan> plans;
    size_t ws_bytes = 256;
    for (size_t i = 0; i < mats.size(); i += RUN_MATS) {
        const std::vector<cuda::exl3_matrix> part(mats.begin() + long(i), mats.begin() + long(std::min(mats.size(), i + RUN_MATS)));
        auto plan = cuda::plan_exl3_gemv(m.device(), part);
        if (!plan) return plan.status();
        ws_bytes = std::max(ws_bytes, plan->workspace_bytes);
        plans.push_back(std::move(plan.value()));
    }
    dtemp ws = m.temp(ws_bytes);
    for (const cuda::exl3_plan &p : plans) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws.as<void>(), 0, p.workspace_bytes, m.stream()));
        DS41RT_RETURN_IF_ERROR(cuda::run_exl3_gemv(p, ws.as<void>(), m.stream()));
    }
    return Status::ok();
}

}  // namespace

Status exl3_routed_sum(const device_model &m, const std::vector<exl3_expert> &experts,
                       const backend::cpu::expert_numerics &nm, const float *x, int64_t D,
                       const backend::cpu::route_table &rt, float *acc) {
    const int64_t S = rt.rows(), E = int64_t(experts.size());
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, size_t(S * D) * sizeof(float), m.stream()));
    // Rows grouped by expert, experts in increasing id (routed_expert_sum's order).
    std::vector<std::vector<std::pair<int32_t, float>>> by_expert(static_cast<size_t>(E));
    for (int64_t r = 0; r < S; r++)
        for (uint32_t i = rt.offsets[size_t(r)]; i < rt.offsets[size_t(r) + 1]; i++) {
            const backend::cpu::route &ro = rt.routes[i];
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
            const exl3_expert &x3 = experts[size_t(e)];
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
    auto idx_d = m.upload_temp(idx.data(), idx.size() * sizeof(int32_t));
    if (!idx_d) return idx_d.status();
    auto w_d = m.upload_temp(wts.data(), wts.size() * sizeof(float));
    if (!w_d) return w_d.status();
    const bool off = nm.official, after = nm.weight_after_w2;
    const cudaStream_t st = m.stream();

    // x of every route, in expert order; OFFICIAL's FP8 activation quantization is per row, so
    // quantizing the gathered rows is quantizing x.
    dtemp xg = m.temp_f32(R * D), gu = m.temp_f32(2 * R * I), ye = m.temp_f32(R * D);
    float *g = gu.f(), *u = gu.f() + R * I;
    DS41RT_RETURN_IF_ERROR(cuda::gather_rows(x, idx_d->as<int32_t>(), R, D, xg.f(), st));
    if (off) DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp8_ue8m0(xg.f(), R, D, nm.act_block, st));

    // The selected experts' w1 and w3 on their rows, 16 rows a matrix, all in run_gemvs.
    auto chunks = [&](auto &&add) {
        for (int64_t e = 0; e < E; e++)
            for (int64_t r0 = first[size_t(e)]; r0 < first[size_t(e) + 1]; r0 += GEMV_ROWS)
                add(experts[size_t(e)], r0, std::min(GEMV_ROWS, first[size_t(e) + 1] - r0));
    };
    std::vector<cuda::exl3_matrix> mats;
    chunks([&](const exl3_expert &w, int64_t r0, int64_t n) {
        mats.push_back(matrix_of(w.w1, xg.f() + r0 * D, g + r0 * I, n));
        mats.push_back(matrix_of(w.w3, xg.f() + r0 * D, u + r0 * I, n));
    });
    DS41RT_RETURN_IF_ERROR(run_gemvs(m, mats));
    if (off) DS41RT_RETURN_IF_ERROR(cuda::round_bf16_inplace(gu.f(), 2 * R * I, st));  // the FP4 class's bf16 outputs

    // h = weight * SwiGLU(g, u) (bf16 when OFFICIAL), into g; OFFICIAL quantizes it for w2.
    DS41RT_RETURN_IF_ERROR(cuda::swiglu_rows(g, u, after ? nullptr : w_d->f(), g, R, I, nm.swiglu_limit, off, st));
    if (off) DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp8_ue8m0(g, R, I, nm.act_block, st));

    mats.clear();
    chunks([&](const exl3_expert &w, int64_t r0, int64_t n) {
        mats.push_back(matrix_of(w.w2, g + r0 * I, ye.f() + r0 * D, n));
    });
    DS41RT_RETURN_IF_ERROR(run_gemvs(m, mats));

    // Each expert's outputs (bf16 when OFFICIAL, then the weight when after w2) onto its rows:
    // expert by expert, so every row adds its routes in increasing expert id.
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = first[size_t(e) + 1] - first[size_t(e)];
        if (n == 0) continue;
        DS41RT_RETURN_IF_ERROR(cuda::scatter_add_rows(acc, ye.f() + first[size_t(e)] * D,
                                                      idx_d->as<int32_t>() + first[size_t(e)],
                                                      after ? w_d->f() + first[size_t(e)] : nullptr, n, D, off, st));
    }
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
