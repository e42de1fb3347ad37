// The expert worker: holds the TP slice of the routed experts of the layers a plan gives it, and
// answers expert requests over any channel.
//
// What crosses this boundary: a checkpoint directory, a plan and this worker's index in it come
// in; frames go in and out. A request carries rows (hidden states after the FFN norm) and each
// row's routes; the answer is one FP32 partial row per row: this rank's slice of the experts,
// summed over the row's routes in the order the single-process engine sums them
// (backend/cpu/routed.h). Anything wrong with a request (stale placement version, a layer not
// held here, a malformed frame) is answered with an ERROR frame naming the reason; a frame
// whose header does not decode also ends the connection, since the stream is out of step.
// A GPU worker also serves the NCCL data path: an NCCL_BOOTSTRAP frame on a connection turns
// it into that link's control channel (dist/nccl_wire.h, dist/cuda/nccl_worker.h).
//
// Threading: handle() may be called from several threads (serve() runs one per connection);
// the expert arithmetic itself runs one request at a time per process, since the CPU backend's
// thread pool serves one caller at a time.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/routed.h"
#include "core/status.h"
#include "dist/plan.h"
#include "dist/tcp_transport.h"
#include "dist/wire.h"
#include "model/config.h"

namespace ds41rt::dist {

class gpu_experts;

class expert_worker {
public:
    // Loads config.json and, for every layer the plan places on worker `rank`, that rank's slice
    // of every routed expert (w1, w3 rows and w2 columns of the intermediate dimension).
    // device >= 0: the slices go to that GPU in their stored form and requests run there
    // (dist/cuda/gpu_experts; builds with CUDA; MXFP4, NVFP4 or EXL3); -1: the CPU backend.
    ~expert_worker();
    static Result<std::unique_ptr<expert_worker>> load(const std::string &model_dir, const Plan &plan, int rank,
                                                       int device = -1);

    // Dummy weights (`--load-format dummy`): c's shapes (the built-in full-size ones, or a
    // checkpoint's config.json), each slice filled on GPU `device` from (seed, tensor id) exactly
    // as the coordinator's dummy plan (model/dummy_weights) fills that range of the whole tensor,
    // so a full-size worker starts in seconds. Official MXFP4 or EXL3 experts, CUDA builds only.
    static Result<std::unique_ptr<expert_worker>> load_dummy(const model::model_config &c, const Plan &plan, int rank,
                                                             int device, uint64_t seed);

    // One frame in, one frame out. close_after: the connection must end after the answer.
    frame_bytes handle(const frame_bytes &in, bool *close_after);

    // Serves connections from l until stop is set (checked every 200 ms); one thread per
    // connection, all joined before it returns.
    Status serve(tcp_listener &l, const std::atomic<bool> &stop);

    int rank() const { return rank_; }
    uint64_t placement_version() const { return version_; }
    std::vector<int> layers() const;

private:
    struct layer_slice {
        int tp = 1, tp_rank = 0;
        Slice slice;
        std::vector<backend::cpu::expert_weights> experts;
    };
    expert_worker() = default;
    // This rank's TP slice of a remote layer lp (cut on align-channel blocks); empty when the
    // layer is not this rank's. Both loaders (checkpoint and dummy) use it.
    static Result<std::optional<layer_slice>> slice_of(const LayerPlacement &lp, int rank, const model::model_config &c,
                                                       int align);
    frame_bytes answer_request(const frame_bytes &in);
    void serve_connection(std::unique_ptr<channel> ch, const std::atomic<bool> &stop);
    // NCCL_BOOTSTRAP on ch: answer it, then serve the NCCL data path until the link ends.
    void serve_nccl_link(channel &ch, const frame_bytes &in, const std::atomic<bool> &stop);

    model::model_config cfg_;
    uint64_t version_ = 0;
    int rank_ = 0;
    std::map<int, layer_slice> layers_;
    std::unique_ptr<gpu_experts> gpu_;  // set when the slices live on a GPU
};

}  // namespace ds41rt::dist
