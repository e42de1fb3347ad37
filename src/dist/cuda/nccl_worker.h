// A GPU expert worker's side of the NCCL data path (dist/nccl_wire.h): after the control
// channel's NCCL_BOOTSTRAP has been answered, join the communicator and serve requests on it
// until the coordinator hangs up the control channel, the link fails, or stop is set.
//
// Per request, one host synchronisation: the 64-byte header comes down to the host (it sizes
// the payload) and is checked there; then, queued on the link's stream without waiting: receive
// x, ids and weights, run this worker's slice of the layer from the routes on the GPU
// (gpu_experts run_routed), send the partial rows and the status word back, and post the
// receive of the next header. A header that decodes but does not fit this worker is drained and
// answered with a non-zero status; one that does not decode ends the link (the sizes are
// unknown). A request whose routes the slice cannot serve is answered EXPERTS_FAILED, and the
// reason is logged when the next header arrives.
//
// Threads: runs on the control channel's thread; `compute` serialises the expert arithmetic
// with the worker's other connections.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cpu/routed.h"
#include "core/status.h"
#include "dist/nccl_wire.h"
#include "dist/tcp_transport.h"

namespace ds41rt::dist {

class gpu_experts;

struct nccl_worker_info {
    uint64_t placement_version = 0;
    uint32_t executor = 0;                           // this worker's index in the plan
    int64_t dim = 0;
    std::map<int, std::pair<int, int>> layers;       // layer -> (TP rank, TP width)
    backend::cpu::expert_numerics numerics;          // act_block, swiglu_limit, kind; flags per request
};

// Returns when the link ends; the reason (OK when the coordinator hung up or stop was set).
Status serve_nccl(channel &ctl, const nccl_bootstrap &b, gpu_experts &g, const nccl_worker_info &info,
                  std::mutex &compute, const std::atomic<bool> &stop);

}  // namespace ds41rt::dist
