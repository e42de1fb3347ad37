// The device memory of the sequences' state (window rings, compressed entries, index keys): pages
// of a few fixed sizes carved from large slabs, handed to a sequence as its state grows and back
// to the pool when it ends, so growing copies nothing, a sequence's stores waste at most a page
// each, and the bytes held for state are one figure the engine can report and bound.
//
// A store's page holds the rows of PAGE_TOKENS tokens (a compressed layer of ratio r: PAGE_TOKENS
// / r entries and index keys), the 512-token page group of the reference system that
// dist/charges plans the KV pool in; a window ring is one page of its W rows.
//
// Slabs come from the model's stream-ordered pool (cudaMallocAsync) and are kept until the
// pool goes; a page given back is reused by the next take of its size. Everything that reads or
// writes pages runs on the one stream the pool was made with, so a page given back while
// kernels still read it is rewritten only after them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace ds41rt::engine::gpu {

constexpr int64_t PAGE_TOKENS = 512;

class page_pool {
public:
    // cap_bytes: the most slab memory to hold (0: as much as the device gives).
    explicit page_pool(cudaStream_t s, int64_t cap_bytes = 0) : s_(s), cap_(cap_bytes) {}
    ~page_pool();
    page_pool(const page_pool &) = delete;
    page_pool &operator=(const page_pool &) = delete;

    // A page of `bytes` (rounded up to 256; 256-byte aligned). RESOURCE_EXHAUSTED, with the
    // pool's figures, when no slab can be added.
    Result<uint8_t *> take(int64_t bytes);
    // Back to the pool: a page take(bytes) gave.
    void give(uint8_t *page, int64_t bytes);

    int64_t held_bytes() const { return held_; }  // slabs
    int64_t used_bytes() const { return used_; }  // pages out

private:
    static int64_t rounded(int64_t bytes) { return (bytes + 255) / 256 * 256; }
    cudaStream_t s_;
    int64_t cap_;
    std::map<int64_t, std::vector<uint8_t *>> free_;  // by rounded page size
    std::vector<void *> slabs_;
    int64_t held_ = 0, used_ = 0;
};

// A page owned by a sequence's store, given back when the store goes.
class pool_page {
public:
    pool_page() = default;
    pool_page(page_pool *pool, uint8_t *p, int64_t bytes) : pool_(pool), p_(p), bytes_(bytes) {}
    ~pool_page() {
        if (pool_ && p_) pool_->give(p_, bytes_);
    }
    pool_page(pool_page &&o) noexcept { swap(o); }
    pool_page &operator=(pool_page &&o) noexcept {
        swap(o);
        return *this;
    }
    pool_page(const pool_page &) = delete;
    pool_page &operator=(const pool_page &) = delete;
    uint8_t *get() const { return p_; }

private:
    void swap(pool_page &o) noexcept {
        std::swap(pool_, o.pool_);
        std::swap(p_, o.p_);
        std::swap(bytes_, o.bytes_);
    }
    page_pool *pool_ = nullptr;
    uint8_t *p_ = nullptr;
    int64_t bytes_ = 0;
};

}  // namespace ds41rt::engine::gpu
