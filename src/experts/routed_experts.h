// The routed experts of every MoE layer, local or remote, behind one interface.
//
// What crosses this boundary: per MoE layer, the batch's rows (hidden states after the FFN
// norm, [rows, dim] FP32) and each row's routes (expert id, exact FP32 gate weight); back comes
// the FP32 sum of the routed experts per row, unrounded. The engine adds the shared expert once
// and rounds once, exactly as it did when the loop lived in the forward pass, so where the
// experts run does not change what the engine does with their sum.
//
// Local layers run backend/cpu/routed.h on the full experts. Remote layers send the same
// request to every TP rank of the layer (dist/wire.h over dist/tcp_transport.h), collect the
// partials by rank whatever order they arrive in, and add them in FP32 in rank order. A remote
// failure (refused, timed out, closed, malformed or stale answer) is UNAVAILABLE naming the
// layer, the worker and the reason, within the layout's timeout; the connections of that layer
// are dropped and re-opened (with the placement-version handshake) on the next request.
//
// Threading: run() is called by one thread at a time (the engine's).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/routed.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"

namespace ds41rt::experts {

// How the coordinator reaches a worker: TCP frames with rows on the host (experts/remote), or
// NCCL with rows on the coordinator's GPU (experts/cuda/nccl_remote: GPU workers, the GPU
// engine), bootstrapped over the same TCP control channel.
enum class transport_kind { TCP, NCCL };

// Where each layer's routed experts live (made from a dist::Plan by experts/from_plan.h).
struct remote_layout {
    uint64_t placement_version = 0;
    std::vector<std::string> workers;           // endpoint of each worker, by plan index
    std::vector<std::vector<int>> layer_ranks;  // per layer: workers in TP-rank order; empty = local
    int timeout_ms = 3000;                      // one layer's whole exchange (all ranks)
    int connect_timeout_ms = 1000;
    std::vector<transport_kind> transports;     // per worker, by plan index; missing entries are TCP
    bool any_remote() const;
    transport_kind transport(int worker) const;
    // True when every rank of the layer is an NCCL worker (the GPU engine's NCCL path).
    bool layer_nccl(int layer) const;
};

class routed_experts {
public:
    virtual ~routed_experts() = default;
    // start() begins a layer (remote: the requests are sent), finish() completes it:
    // acc[rt.rows(), dim] = each row's routed-expert sum (see above). x: [rt.rows(), dim]; x and
    // rt must stay valid until finish(). Between the two the caller does its own work (the
    // engine runs the shared expert), so a remote layer's round trip overlaps it. One layer at a
    // time: every start() is followed by finish() before the next start().
    virtual Status start(int layer, const backend::cpu::expert_numerics &nm, const float *x,
                         const backend::cpu::route_table &rt) = 0;
    virtual Status finish(float *acc) = 0;

    Status run(int layer, const backend::cpu::expert_numerics &nm, const float *x, const backend::cpu::route_table &rt,
               float *acc) {
        DS41RT_RETURN_IF_ERROR(start(layer, nm, x, rt));
        return finish(acc);
    }
};

using weight_fn = std::function<Result<Tensor>(const std::string &name)>;

// An NVFP4 expert's activation scales (its "<prefix>w1.input_scale", shared with w3, and
// "<prefix>w2.input_scale") into w, which then runs the publication's W4A4 numerics.
Status nvfp4_input_scales(const weight_fn &src, const std::string &expert_prefix, backend::cpu::expert_weights *w);

// Loads the local layers' experts from src ("layers.L.ffn.experts.E.w{1,2,3}.weight") and
// prepares (does not yet open) the connections of the remote ones. An empty layout: all local.
Result<std::unique_ptr<routed_experts>> open(const model::model_config &c, const weight_fn &src,
                                             const remote_layout &layout);

}  // namespace ds41rt::experts
