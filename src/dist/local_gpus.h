// Local expert layers on a second (third, ...) coordinator GPU, which `ds41rt plan --gpus 2`
// places there: each such GPU's layers are served by an expert worker running inside the
// coordinator's process (dist/worker on that GPU, on a thread, listening on a loopback port),
// and the plan is rewritten so those layers become remote layers of that worker. The engine then
// reaches them as it reaches any GPU worker: over NCCL (GPU to GPU, inside the captured decode
// step) when the coordinator runs on a GPU, over TCP otherwise. What the planner charged to the
// GPU is what the worker loads: the layers' experts at full width (TP1).
//
// Coordinator GPU g is CUDA device g of this process. The planner charges such a GPU the dense
// weights and KV of its layers (a layer split); here they stay on GPU 0, so start() refuses a plan
// whose GPU 0 budget cannot take them as well, saying by how much.
// Threads: the workers serve on their own threads until the object is destroyed.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "dist/plan.h"
#include "dist/tcp_transport.h"
#include "dist/worker.h"

namespace ds41rt::dist {

class local_gpu_workers {
public:
    // Loads worker `rank` of the rewritten plan onto CUDA device `device`: expert_worker::load
    // from a checkpoint, or load_dummy.
    using loader = std::function<Result<std::unique_ptr<expert_worker>>(const Plan &rewritten, int rank, int device)>;

    // Starts a worker for every coordinator GPU >= 1 that holds local layers of plan, loaded by
    // load; *rewritten: the plan the coordinator runs (those layers remote, one worker slot per
    // such GPU, transport "nccl" when nccl, else "tcp"). With no such layer, *rewritten = plan
    // and nothing starts.
    static Result<std::unique_ptr<local_gpu_workers>> start(const Plan &plan, bool nccl, const loader &load,
                                                            Plan *rewritten);
    // start() with expert_worker::load from the checkpoint in model_dir.
    static Result<std::unique_ptr<local_gpu_workers>> start(const std::string &model_dir, const Plan &plan, bool nccl,
                                                            Plan *rewritten);
    ~local_gpu_workers();  // stops and joins the workers
    local_gpu_workers(const local_gpu_workers &) = delete;
    local_gpu_workers &operator=(const local_gpu_workers &) = delete;
    int count() const { return int(threads_.size()); }

private:
    local_gpu_workers() = default;
    std::atomic<bool> stop_{false};
    std::vector<std::unique_ptr<expert_worker>> workers_;
    std::vector<std::unique_ptr<tcp_listener>> listeners_;
    std::vector<std::thread> threads_;
};

}  // namespace ds41rt::dist
