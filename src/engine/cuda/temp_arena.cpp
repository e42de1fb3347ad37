#include "engine/cuda/temp_arena.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace ds41rt::engine::gpu {

namespace {
thread_local temp_arena *t_arena = nullptr;
}

temp_arena *set_temp_arena(temp_arena *a) {
    temp_arena *old = t_arena;
    t_arena = a;
    return old;
}

std::shared_ptr<temp_arena> make_device_arena(size_t bytes) {
    auto *a = new temp_arena;
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) == cudaSuccess) a->base = static_cast<uint8_t *>(p), a->cap = bytes;
    else (void)cudaGetLastError();
    return std::shared_ptr<temp_arena>(a, [](temp_arena *x) {
        if (x->base) cudaFree(x->base);  // cudaFree waits for the device: no replay still reads it
        delete x;
    });
}

void *arena_alloc(size_t bytes) {
    const size_t n = (std::max<size_t>(bytes, 16) + 255) & ~size_t(255);
    if (!t_arena || t_arena->used + n > t_arena->cap) return nullptr;
    void *p = t_arena->base + t_arena->used;
    t_arena->used += n;
    return p;
}

}  // namespace ds41rt::engine::gpu
