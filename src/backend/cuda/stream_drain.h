// A bounded wait for a stream, for the failure paths where something it waits on was aborted
// (an NCCL exchange whose communicator was aborted ends its kernels shortly after): the caller
// must not reuse the stream's buffers before its queued work has ended, and must not hang if it
// never does.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <thread>

namespace ds41rt::backend::cuda {

// Records ev on stream and polls it for up to ms milliseconds. True when everything queued on
// the stream before the call has ended (or the stream reported an error, which also ends it).
inline bool drain_stream(cudaStream_t stream, cudaEvent_t ev, int ms) {
    if (cudaEventRecord(ev, stream) != cudaSuccess) return false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    cudaError_t e;
    while ((e = cudaEventQuery(ev)) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    return e != cudaErrorNotReady;
}

}  // namespace ds41rt::backend::cuda
