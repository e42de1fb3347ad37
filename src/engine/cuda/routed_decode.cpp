#include "engine/cuda/routed_decode.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;

Status routed_decode::run(const device_model &m, int layer, const cuda::moe_layer &moe, const float *x,
                          const int32_t *ids, const float *wts, int64_t S, int K, float *acc) {
    const int64_t D = moe.D;
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
                                                    w.mem.as<void>(), m.stream()));
    }
    return Status::ok();
}

Status routed_decode::run_exl3(const device_model &m, int layer, const std::vector<cuda::exl3_expert_dev> &experts,
                               const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids,
                               const float *wts, int64_t S, int K, float *acc) {
    if (S < 1 || S > cuda::MOE_MAX_ROWS)
        return Status::internal("layer " + std::to_string(layer) + ": EXL3 routed decode of " + std::to_string(S) + " rows");
    const int B = int(S);
    auto plan_for = [&](int rows) -> Result<const cuda::exl3_routed_plan *> {
        auto it = exl3_plans_.find({layer, rows});
        if (it == exl3_plans_.end()) {
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(m.stream(), &cs));
            if (cs != cudaStreamCaptureStatusNone)
                return Status::internal("layer " + std::to_string(layer) + ": no EXL3 routed-expert plan for " +
                                        std::to_string(rows) + " rows while a graph is being captured");
            auto p = cuda::plan_exl3_routed(m.device(), experts, nm, m.config().dim, rows, K);
            if (!p) return p.status();
            it = exl3_plans_.emplace(std::make_pair(layer, rows), std::move(p.value())).first;
        }
        return &it->second;
    };
    if (!exl3_ws_.bytes()) {  // sized by the largest row count's plan; graphs hold its address
        auto big = plan_for(cuda::MOE_MAX_ROWS);
        if (!big) return big.status();
        exl3_ws_ = m.temp((*big)->workspace_bytes);
        if (!exl3_ws_.as<void>())
            return Status::resource_exhausted("EXL3 routed decode: no device memory for a workspace of " +
                                              std::to_string((*big)->workspace_bytes) + " bytes");
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(exl3_ws_.as<void>(), 0, exl3_ws_.bytes(), m.stream()));
    }
    auto plan = plan_for(B);
    if (!plan) return plan.status();
    if ((*plan)->workspace_bytes > exl3_ws_.bytes())
        return Status::internal("layer " + std::to_string(layer) + ": EXL3 routed-expert workspace of " +
                                std::to_string((*plan)->workspace_bytes) + " bytes exceeds the shared " +
                                std::to_string(exl3_ws_.bytes()));
    exl3_used_ = *plan;
    return cuda::run_exl3_routed(**plan, x, ids, wts, acc, exl3_ws_.as<void>(), m.stream());
}

Status routed_decode::check(const device_model &m) {
    if (exl3_used_) DS41RT_RETURN_IF_ERROR(cuda::exl3_routed_error(*exl3_used_, exl3_ws_.as<void>(), m.stream()));
    for (auto &[B, w] : ws_) {
        if (!w.plan) continue;
        DS41RT_RETURN_IF_ERROR(cuda::moe_routed_error(*w.plan, w.mem.as<void>(), m.stream()));
    }
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
