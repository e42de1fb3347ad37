#include "engine/cuda/page_pool.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::engine::gpu {

namespace {
constexpr int64_t SLAB_BYTES = int64_t(32) << 20;  // a slab's pages: as many of one size as fit
}

page_pool::~page_pool() {
    for (void *p : slabs_) cudaFreeAsync(p, s_);
}

Result<uint8_t *> page_pool::take(int64_t bytes) {
    if (bytes <= 0) return Status::invalid_argument("page_pool: a page of " + std::to_string(bytes) + " bytes");
    const int64_t size = rounded(bytes);
    std::vector<uint8_t *> &free = free_[size];
    if (free.empty()) {
        const int64_t pages = std::max<int64_t>(1, SLAB_BYTES / size), slab = pages * size;
        void *p = nullptr;
        const cudaError_t e = cap_ > 0 && held_ + slab > cap_ ? cudaErrorMemoryAllocation : cudaMallocAsync(&p, size_t(slab), s_);
        if (e != cudaSuccess) {
            cudaGetLastError();  // an allocation failure is not sticky: clear it
            return Status::resource_exhausted(
                "sequence state: no device memory for another " + std::to_string(slab >> 20) + " MiB of " +
                std::to_string(size) + "-byte pages (" + std::to_string(held_ >> 20) + " MiB held, " +
                std::to_string(used_ >> 20) + " MiB in use" + (cap_ > 0 ? ", cap " + std::to_string(cap_ >> 20) + " MiB" : "") +
                "); free sequences or shorten them");
        }
        slabs_.push_back(p);
        held_ += slab;
        for (int64_t i = pages - 1; i >= 0; i--) free.push_back(static_cast<uint8_t *>(p) + i * size);
    }
    uint8_t *page = free.back();
    free.pop_back();
    used_ += size;
    return page;
}

void page_pool::give(uint8_t *page, int64_t bytes) {
    const int64_t size = rounded(bytes);
    free_[size].push_back(page);
    used_ -= size;
}

}  // namespace ds41rt::engine::gpu
