#include "experts/from_plan.h"

namespace ds41rt::experts {

remote_layout layout_from_plan(const dist::Plan &plan, int timeout_ms, int connect_timeout_ms) {
    remote_layout l;
    l.placement_version = plan.version();
    for (const auto &w : plan.workers) {
        l.workers.push_back(w.endpoint);
        l.transports.push_back(w.transport == "nccl" ? transport_kind::NCCL : transport_kind::TCP);
    }
    l.layer_ranks.resize(plan.layers.size());
    for (size_t i = 0; i < plan.layers.size(); i++)
        if (plan.layers[i].remote) l.layer_ranks[i] = plan.layers[i].ranks;
    l.timeout_ms = timeout_ms;
    l.connect_timeout_ms = connect_timeout_ms;
    return l;
}

Status check_coordinator_devices(const dist::Plan &plan) {
    for (const auto &l : plan.layers)
        if (!l.remote && l.local_device != 0)
            return Status::not_supported(
                "the plan holds layer " + std::to_string(l.layer) + "'s experts on coordinator GPU " +
                std::to_string(l.local_device) + " (" + plan.coordinator[size_t(l.local_device)].name +
                "); the engine runs its local layers on one GPU: plan with --gpus 1 and give the other GPU's "
                "share to expert workers (`ds41rt worker --device 1`, transport nccl)");
    return Status::ok();
}

}  // namespace ds41rt::experts
