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

}  // namespace ds41rt::experts
