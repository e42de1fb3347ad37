#include "engine/cuda/step_graphs.h"

#include "backend/cuda/cuda_status.h"

namespace ds41rt::engine::gpu {

namespace {
struct arena_scope {
    temp_arena *prev;
    explicit arena_scope(temp_arena *a) : prev(set_temp_arena(a)) {}
    ~arena_scope() { set_temp_arena(prev); }
};
}  // namespace

Status step_graphs::run(size_t key, bool capture, const std::function<Status()> &fn) {
    if (key < exec_.size() && exec_[key]) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_[key], s_));
        return Status::ok();
    }
    if (!capture) return fn();
    if (arena_) arena_->used = 0;  // the last capture's graph keeps its bytes; replays run in stream order
    // Thread-local mode: other threads' CUDA calls (a worker's, the server's) are not this capture's.
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
    Status st;
    {
        arena_scope scope(arena_.get());
        st = fn();
    }
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(s_, &g);
    if (!st.is_ok() || e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return st.is_ok() ? backend::cuda::cuda_status(e, "cudaStreamEndCapture", __FILE__, __LINE__) : st;
    }
    cudaGraphExec_t x = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    DS41RT_CUDA_RETURN_IF_ERROR(ie);
    if (exec_.size() <= key) exec_.resize(key + 1, nullptr);
    exec_[key] = x;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(x, s_));
    return Status::ok();
}

void step_graphs::clear() {
    for (cudaGraphExec_t &x : exec_)
        if (x) cudaGraphExecDestroy(x), x = nullptr;
    exec_.clear();
}

size_t step_graphs::captured() const {
    size_t n = 0;
    for (cudaGraphExec_t x : exec_) n += x != nullptr;
    return n;
}

}  // namespace ds41rt::engine::gpu
