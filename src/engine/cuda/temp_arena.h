// Where a thread's dtemps (device_model.h) come from while a step piece is captured
// (step_graphs): a bump arena instead of the stream-ordered pool, so the graph holds no memory
// nodes. A captured cudaMallocAsync / cudaFreeAsync becomes a node between the kernels around it,
// and a kernel behind a memory node waits for its predecessor to finish instead of overlapping
// its start with the predecessor's end (PDL). A dtemp never frees arena memory; the arena's owner
// hands the same bytes to its next capture, which is safe because a piece's temporaries die with
// the piece and pieces run one after another on one stream. An allocation the arena cannot hold
// comes from the pool as before.
//
// Threads: the arena is per thread (a capture is thread-local, as step_graphs begins it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ds41rt::engine::gpu {

struct temp_arena {
    uint8_t *base = nullptr;
    size_t cap = 0, used = 0;
};

// Sets this thread's arena (null: the pool again); returns the one it replaces.
temp_arena *set_temp_arena(temp_arena *a);

// An arena of `bytes` of device memory (cudaMalloc; freed, after the device is idle, with the
// last owner), or an empty one (cap 0) when the device has no room for it.
std::shared_ptr<temp_arena> make_device_arena(size_t bytes);

// `bytes` (at least 16, 256-byte aligned) from this thread's arena; null when there is none or it
// is full.
void *arena_alloc(size_t bytes);

}  // namespace ds41rt::engine::gpu
