// The readable form of a placement, shared by `ds41rt plan` and `ds41rt launch`: the inputs, the
// per-layer routed-expert cost of every format at the plan's TP width, every owner's budget and
// each of its charges, where each layer's experts live with the bytes per rank, and what stays
// on the host.
#pragma once

#include <string>

#include "dist/placement.h"

namespace ds41rt::app {

std::string plan_table(const dist::placement_input &in, const dist::placement &p);

}  // namespace ds41rt::app
