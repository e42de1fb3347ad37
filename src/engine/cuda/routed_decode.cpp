#include "engine/cuda/routed_decode.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;

namespace {

// The number of distinct experts in ids [S, K] (-1: a dropped pick): the experts whose weights
// a step reads. Profiled steps only (they run eagerly): the routes come to the host, a
// synchronisation before the timed launches.
Result<int64_t> experts_used(const device_model &m, const int32_t *ids, int64_t S, int K) {
    std::vector<int32_t> h(static_cast<size_t>(S * K));
    DS41RT_RETURN_IF_ERROR(m.to_host(h.data(), ids, h.size() * sizeof(int32_t)));
    std::sort(h.begin(), h.end());
    const auto last = std::unique(h.begin(), h.end());
    return int64_t(last - std::upper_bound(h.begin(), last, -1));
}

std::string label(const char *format, int64_t S) {
    return std::string("ffn.experts [") + format + " routed, B " + std::to_string(S) + "]";
}

}  // namespace

Status routed_decode::run(const device_model &m, int layer, const cuda::moe_layer &moe, const float *x,
                          const int32_t *ids, const float *wts, int64_t S, int K, float *acc,
                          const cuda::gemv_split &x_split) {
    const int64_t D = moe.D;
    std::optional<section_scope> timed;
    if (section_timer *t = m.product_timer()) {
        auto used = experts_used(m, ids, S, K);
        if (!used) return used.status();
        const double nk = double(D) * moe.I, per_matrix = nk / 2 + nk / (moe.nvfp4_experts.empty() ? 32 : 16);
        timed.emplace(*t, label(moe.nvfp4_experts.empty() ? "mxfp4" : "nvfp4", S), m.stream(),
                      double(used.value()) * 3 * per_matrix + double(S) * D * 2 * sizeof(float), 2.0 * double(S) * K * 3 * nk);
    }
    for (int64_t r0 = 0; r0 < S; r0 += cuda::MOE_MAX_ROWS) {
        const int B = int(std::min<int64_t>(cuda::MOE_MAX_ROWS, S - r0));
        auto it = plans_.find({layer, B});
        workspace &w = ws_[B];
        if (it == plans_.end() || !w.mem.bytes()) {
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(m.stream(), &cs));
            if (cs != cudaStreamCaptureStatusNone)
                return Status::internal("layer " + std::to_string(layer) + ": no routed-expert plan for " +
                                        std::to_string(B) + " rows while a graph is being captured");
        }
        if (it == plans_.end()) {
            auto p = cuda::plan_moe_routed(m.device(), moe, B, K);
            if (!p) return p.status();
            it = plans_.emplace(std::make_pair(layer, B), std::move(p.value())).first;
        }
        const cuda::moe_routed_plan &plan = it->second;
        // One workspace per row count, never reallocated once used (graphs hold its address).
        if (w.plan && w.plan->workspace_bytes != plan.workspace_bytes)
            return Status::internal("layer " + std::to_string(layer) + ": routed-expert workspace layout differs "
                                    "from another layer's at " + std::to_string(B) + " rows");
        if (!w.mem.bytes()) {
            w.mem = m.temp(plan.workspace_bytes);
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.mem.as<void>(), 0, plan.workspace_bytes, m.stream()));
        }
        w.plan = &plan;
        DS41RT_RETURN_IF_ERROR(cuda::run_moe_routed(plan, x + r0 * D, ids + r0 * K, wts + r0 * K, acc + r0 * D,
                                                    w.mem.as<void>(), m.stream(), S == 1 && x_split.xs ? &x_split : nullptr));
    }
    return Status::ok();
}

Status routed_decode::run_exl3(const device_model &m, int layer, const std::vector<cuda::exl3_expert_dev> &experts,
                               const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids,
                               const float *wts, int64_t S, int K, float *acc) {
    if (S < 1 || S > cuda::MOE_MAX_ROWS)
        return Status::internal("layer " + std::to_string(layer) + ": EXL3 routed decode of " + std::to_string(S) + " rows");
    std::optional<section_scope> timed;
    if (section_timer *t = m.product_timer(); t && !experts.empty()) {
        auto used = experts_used(m, ids, S, K);
        if (!used) return used.status();
        double per_expert = 0, flops = 0;  // trellis codes (k bits a weight) and the two sign vectors
        for (const cuda::exl3_linear_dev *w : {&experts[0].w1, &experts[0].w2, &experts[0].w3}) {
            per_expert += double(w->in) * double(w->out) * w->k / 8 + double(w->in + w->out) * 2;
            flops += 2.0 * double(S) * K * double(w->in) * double(w->out);
        }
        const double D = m.config().dim;
        timed.emplace(*t, label("exl3", S), m.stream(), double(used.value()) * per_expert + double(S) * D * 2 * sizeof(float),
                      flops);
    }
    return exl3_.run(m.device(), layer, experts, nm, m.config().dim, int(S), K, x, ids, wts, acc, m.stream());
}

routed_decode::~routed_decode() {
    if (words_) cudaFreeHost(words_);
}

Status routed_decode::stage_errors(const device_model &m) {
    constexpr size_t WORDS = ERROR_SLOTS * cuda::MOE_ROUTED_ERROR_WORDS + cuda::EXL3_ROUTED_ERROR_WORDS;
    if (!words_) DS41RT_CUDA_RETURN_IF_ERROR(cudaMallocHost(&words_, WORDS * sizeof(int32_t)));
    std::fill(words_, words_ + WORDS, 0);
    for (auto &[B, w] : ws_) {
        if (!w.plan) continue;
        if (B < 1 || B >= ERROR_SLOTS) return Status::internal("routed_decode: a workspace of " + std::to_string(B) + " rows");
        DS41RT_RETURN_IF_ERROR(
            cuda::moe_routed_error_copy(*w.plan, w.mem.as<void>(), words_ + B * cuda::MOE_ROUTED_ERROR_WORDS, m.stream()));
    }
    DS41RT_RETURN_IF_ERROR(exl3_.error_copy(words_ + ERROR_SLOTS * cuda::MOE_ROUTED_ERROR_WORDS, m.stream()));
    staged_ = true;
    return Status::ok();
}

Status routed_decode::errors() const {
    if (!staged_) return Status::ok();
    DS41RT_RETURN_IF_ERROR(exl3_.error_status(words_ + ERROR_SLOTS * cuda::MOE_ROUTED_ERROR_WORDS));
    for (auto &[B, w] : ws_)
        if (w.plan) DS41RT_RETURN_IF_ERROR(cuda::moe_routed_error_status(*w.plan, words_ + B * cuda::MOE_ROUTED_ERROR_WORDS));
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
