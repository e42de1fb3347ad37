// CUDA errors as Status values (STYLE convention 11, tier (b)): the failing call as text, with
// file and line, so a worker can report it and survive.
#pragma once

#include <cuda_runtime.h>

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
