// A placement plan (dist/plan.h) as the experts room sees it: endpoints and TP ranks per layer.
#pragma once

#include "dist/plan.h"
#include "experts/routed_experts.h"

namespace ds41rt::experts {

remote_layout layout_from_plan(const dist::Plan &plan, int timeout_ms, int connect_timeout_ms);

// For a command that holds a plan's local expert layers on GPU 0 only (bench-remote's dummy
// coordinator): OK when every local layer is on coordinator GPU 0; a plan with local layers on
// another coordinator GPU (`ds41rt plan --gpus 2`) is refused naming the first such layer,
// instead of loading all of them onto GPU 0. (`serve` runs them in-process: dist/local_gpus.)
Status check_coordinator_devices(const dist::Plan &plan);

}  // namespace ds41rt::experts
