#include "backend/cuda/peaks.cuh"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

Result<double> measure_copy_gbps(size_t bytes, int iters) {
    void *a = nullptr, *b = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    auto cleanup = [&] {
        cudaFree(a);
        cudaFree(b);
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
    };
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cleanup();
        (void)cudaGetLastError();
        return Status::resource_exhausted("measure_copy_gbps: no room for 2 x " + std::to_string(bytes) + " bytes");
    }
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemset(a, 1, bytes);
    float best = 1e30f;
    for (int i = 0; i <= iters; i++) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0) best = std::min(best, ms);
    }
    const cudaError_t err = cudaGetLastError();
    cleanup();
    DS41RT_CUDA_RETURN_IF_ERROR(err);
    return 2.0 * double(bytes) / (double(best) * 1e-3) / 1e9;
}

std::string driver_cuda_version() {
    int v = 0;
    if (cudaDriverGetVersion(&v) != cudaSuccess) return "unknown";
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace ds41rt::backend::cuda
