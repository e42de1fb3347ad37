// Pieces of a decode step captured as CUDA graphs and replayed (issue 4 point 2), the way
// "piecewise" graphs work in other engines: the pieces with fixed shapes (mHC, norms, the
// projections, the MoE with its routes on the device) are graphs; the attention core, whose key
// lists and compressed state change length every step, runs eagerly between them.
//
// A piece may be captured only when everything it launches is fixed by the row count: every
// buffer it reads or writes outside its own stream-ordered temporaries is one of the caller's
// fixed buffers (device addresses baked into the graph), and nothing in it synchronises with
// the host. Its temporaries come from the pieces' arena (temp_arena.h): the graphs hold no
// memory nodes.
//
// Threads: one host thread, the stream's owner.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "core/status.h"
#include "engine/cuda/temp_arena.h"

namespace ds41rt::engine::gpu {

class step_graphs {
public:
    // arena: where captures take their temporaries; one for all row counts' graphs of a stream
    // (they run one after another). Null: graph memory nodes, as cudaMallocAsync captures them.
    step_graphs(cudaStream_t s, std::shared_ptr<temp_arena> arena) : s_(s), arena_(std::move(arena)) {}
    ~step_graphs() { clear(); }
    step_graphs(const step_graphs &) = delete;
    step_graphs &operator=(const step_graphs &) = delete;

    // Runs piece `key`: replays its graph when one was captured; else, when capture is set,
    // captures fn into a graph and replays it; else runs fn eagerly. A capture that fails
    // (fn's error, or a launch that cannot be captured) leaves no graph and returns the error.
    Status run(size_t key, bool capture, const std::function<Status()> &fn);
    // Drops every graph (their buffers changed).
    void clear();
    size_t captured() const;

private:
    cudaStream_t s_;
    std::vector<cudaGraphExec_t> exec_;
    std::shared_ptr<temp_arena> arena_;
};

}  // namespace ds41rt::engine::gpu
