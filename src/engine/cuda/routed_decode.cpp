#include "engine/cuda/routed_decode.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;

Status routed_decode::run(const device_model &m, int layer, const cuda::moe_layer &moe, const float *x,
                          const int32_t *ids, const float *wts, int64_t S, int K, float *acc,
                          const cuda::gemv_split &x_split) {
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
                                                    w.mem.as<void>(), m.stream(), S == 1 && x_split.xs ? &x_split : nullptr));
    }
    return Status::ok();
}

Status routed_decode::run_exl3(const device_model &m, int layer, const std::vector<cuda::exl3_expert_dev> &experts,
                               const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids,
                               const float *wts, int64_t S, int K, float *acc) {
    if (S < 1 || S > cuda::MOE_MAX_ROWS)
        return Status::internal("layer " + std::to_string(layer) + ": EXL3 routed decode of " + std::to_string(S) + " rows");
    return exl3_.run(m.device(), layer, experts, nm, m.config().dim, int(S), K, x, ids, wts, acc, m.stream());
}

Status routed_decode::check(const device_model &m) {
    DS41RT_RETURN_IF_ERROR(exl3_.error(m.stream()));
    for (auto &[B, w] : ws_) {
        if (!w.plan) continue;
        DS41RT_RETURN_IF_ERROR(cuda::moe_routed_error(*w.plan, w.mem.as<void>(), m.stream()));
    }
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
