// A second stream for independent work of a step (the shared expert beside the router and the
// routed experts): fork() runs a callable whose launches, made through the device_model, go to
// the side stream after what the model's stream holds so far; join() makes the model's stream
// wait for them. Inside a graph capture the two become parallel branches of the graph. At decode
// every kernel is latency-bound and leaves most of the GPU idle, so two of them overlap well.
//
// The callable must not touch what the model's stream uses meanwhile (the GEMV workspace is the
// model's one: only one side may run GEMVs between fork and join).
//
// Threads: the engine's host thread.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "core/status.h"
#include "engine/cuda/device_model.h"

namespace ds41rt::engine::gpu {

class side_branch {
public:
    side_branch() = default;
    ~side_branch();
    side_branch(const side_branch &) = delete;
    side_branch &operator=(const side_branch &) = delete;

    Status fork(const device_model &m, const std::function<Status()> &work);
    Status join(const device_model &m);

private:
    Status init();
    cudaStream_t side_ = nullptr;
    cudaEvent_t forked_ = nullptr, done_ = nullptr;
};

// One use of a side_branch: fork(), then join() before the result is needed; a fork left
// unjoined (an error on the main side returned early) is joined when the scope ends, so a graph
// capture never ends with a branch still open.
class side_scope {
public:
    side_scope(side_branch &b, const device_model &m) : b_(b), m_(m) {}
    ~side_scope() {
        if (forked_) (void)b_.join(m_);
    }
    side_scope(const side_scope &) = delete;
    side_scope &operator=(const side_scope &) = delete;

    Status fork(const std::function<Status()> &work) {
        forked_ = true;
        return b_.fork(m_, work);
    }
    Status join() {
        if (!forked_) return Status::ok();
        forked_ = false;
        return b_.join(m_);
    }

private:
    side_branch &b_;
    const device_model &m_;
    bool forked_ = false;
};

}  // namespace ds41rt::engine::gpu
