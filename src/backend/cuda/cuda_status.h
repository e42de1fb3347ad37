// CUDA errors as Status values (STYLE convention 11, tier (b)): the failing call as text, with
// file and line, so a worker can report it and survive.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/status.h"

namespace ds41rt::backend::cuda {

inline Status cuda_status(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return Status::ok();
    return Status::internal(std::string(what) + ": " + cudaGetErrorString(e) + " at " + file + ":" +
                            std::to_string(line));
}

}  // namespace ds41rt::backend::cuda

#define DS41RT_CUDA_RETURN_IF_ERROR(call) \
    DS41RT_RETURN_IF_ERROR(::ds41rt::backend::cuda::cuda_status((call), #call, __FILE__, __LINE__))

namespace ds41rt::backend::cuda {

// A kernel's error words (int32 flags it sets and leaves set): copied to host_words (pinned
// memory keeps the copy asynchronous) and zeroed for the next run, both in stream order; the
// host reads them after the stream's next synchronisation.
inline Status stage_error_words(void *words, int n, int32_t *host_words, cudaStream_t stream) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_words, words, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(words, 0, size_t(n) * sizeof(int32_t), stream));
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
