// A placement plan (dist/plan.h) as the experts room sees it: endpoints and TP ranks per layer.
#pragma once

#include "dist/plan.h"
#include "experts/routed_experts.h"

namespace ds41rt::experts {

remote_layout layout_from_plan(const dist::Plan &plan, int timeout_ms, int connect_timeout_ms);

// OK when this build's engine can run the plan's coordinator side: every local expert layer on
// coordinator GPU 0. A plan that puts local layers on a second coordinator GPU (`ds41rt plan
// --gpus 2`) is refused naming the first such layer, instead of loading all of them onto GPU 0.
Status check_coordinator_devices(const dist::Plan &plan);

}  // namespace ds41rt::experts
