#include "backend/cuda/device_info.h"

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

Result<device_info> query_device(int device) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= device) {
        cudaGetLastError();  // clear the sticky "no device" error
        return Status::unavailable("no CUDA device " + std::to_string(device));
    }
    cudaDeviceProp p{};
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, device));
    device_info d;
    d.device = device;
    d.name = p.name;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    d.sm_count = p.multiProcessorCount;
    d.l2_bytes = p.l2CacheSize;
    d.smem_per_block_optin = int64_t(p.sharedMemPerBlockOptin);
    d.global_mem_bytes = int64_t(p.totalGlobalMem);
    return d;
}

}  // namespace ds41rt::backend::cuda
