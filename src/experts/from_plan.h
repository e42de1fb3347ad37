// A placement plan (dist/plan.h) as the experts room sees it: endpoints and TP ranks per layer.
#pragma once

#include "dist/plan.h"
#include "experts/routed_experts.h"

namespace ds41rt::experts {

remote_layout layout_from_plan(const dist::Plan &plan, int timeout_ms, int connect_timeout_ms);


}  // namespace ds41rt::experts
