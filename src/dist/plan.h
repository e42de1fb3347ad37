// The placement plan: which routed-expert layers run where, at which TP width, and the memory
// budget of every owner. It is data, not behaviour: the planner (dist/placement) computes it,
// `ds41rt plan` prints it, and the coordinator and every worker load the same plan.json and
// compare version() before serving (frames carry it, so a stale worker is refused).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds41rt::dist {

// One memory owner: a coordinator GPU or one worker. charges names what the planner counted
// against the budget ("weights.dense", "weights.experts", "kv", "workspace", "graphs",
// "headroom", ...), so `ds41rt plan` can print where every byte goes.
struct DeviceBudget {
    std::string name;           // "gpu0", "worker1"
    uint64_t budget_bytes = 0;  // what the user allows, headroom included
    std::map<std::string, uint64_t> charges;
    uint64_t charged() const;
};

struct WorkerSlot {
    std::string endpoint;  // "host:port" (TCP control channel; NCCL bootstraps over it)
    int device = -1;       // CUDA device on the worker's host, -1 = CPU backend
    DeviceBudget budget;
    // "tcp" (rows framed over the control channel) or "nccl" (rows GPU to GPU, GPU workers with
    // a GPU coordinator; bootstrapped over the control channel). Written to plan.json only when
    // not "tcp", so plans without it keep their versions. Last, so {endpoint, device, budget}
    // initialisers keep meaning what they meant.
    std::string transport = "tcp";
};

// The routed experts of one layer: held by a coordinator device at full width, or by `ranks`
// workers, each holding a tensor-parallel slice of the expert intermediate dimension.
struct LayerPlacement {
    int layer = 0;
    bool remote = false;
    int local_device = 0;      // when !remote: the coordinator GPU (index into coordinator)
    std::vector<int> ranks;    // when remote: worker indices in TP-rank order (ranks.size() = TP)
    int tp() const { return remote ? int(ranks.size()) : 1; }
};

struct Plan {
    std::string model_type;  // "deepseek_v41" | "deepseek_v4"
    std::string format;      // "official" | "nvfp4" | "exl3"
    int num_layers = 0;
    std::vector<DeviceBudget> coordinator;  // one per coordinator GPU (or the CPU backend)
    std::vector<WorkerSlot> workers;
    std::vector<LayerPlacement> layers;     // one per layer, in layer order

    // FNV-1a 64 of the canonical JSON with the budgets' charges left out: two plans place the
    // same layers on the same ranks exactly when their versions agree.
    uint64_t version() const;
};

// A half-open range of the expert intermediate dimension owned by one TP rank.
struct Slice {
    int begin = 0, end = 0;
    int width() const { return end - begin; }
};

// The slice of `width` channels owned by `rank` of `tp`: the width is cut into units of `align`
// channels (32 for MXFP4 blocks, 16 for NVFP4, 128 for EXL3's Hadamard blocks) and the units are
// dealt as evenly as possible, earlier ranks taking the remainder (EXL3 TP4 of 2304: 640, 640,
// 512, 512). Fails when width is not a multiple of align or a rank would get nothing.
Result<Slice> tp_slice(int width, int tp, int rank, int align);

std::string to_json(const Plan &plan);             // canonical: stable key order, 2-space indent
Result<Plan> parse_plan(std::string_view json);    // structure errors name the field
Status validate(const Plan &plan);                 // layers complete, ranks exist, budgets hold

}  // namespace ds41rt::dist
