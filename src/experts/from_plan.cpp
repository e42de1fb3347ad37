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
                "), and this command holds local expert layers on GPU 0 only (`ds41rt serve` runs the other "
                "GPUs' layers in-process); plan with --gpus 1 and put the other GPU under a worker");
    return Status::ok();
}

}  // namespace ds41rt::experts
