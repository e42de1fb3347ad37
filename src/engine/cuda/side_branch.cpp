#include "engine/cuda/side_branch.h"

#include "backend/cuda/cuda_status.h"

namespace ds41rt::engine::gpu {

side_branch::~side_branch() {
    if (side_) cudaStreamDestroy(side_);
    if (forked_) cudaEventDestroy(forked_);
    if (done_) cudaEventDestroy(done_);
}

Status side_branch::init() {
    if (side_) return Status::ok();
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    return Status::ok();
}

Status side_branch::fork(const device_model &m, const std::function<Status()> &work) {
    DS41RT_RETURN_IF_ERROR(init());
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(forked_, m.stream()));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_, forked_, 0));
    const cudaStream_t main = m.set_stream(side_);
    Status st = work();
    m.set_stream(main);
    // Recorded even when the work failed, so a capture can still be joined and ended.
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, side_));
    return st;
}

Status side_branch::join(const device_model &m) {
    if (!side_) return Status::ok();
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(m.stream(), done_, 0));
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
