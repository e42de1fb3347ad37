// A sequence's growing state rows in page_pool pages (compressed entries, index keys): rows of a
// fixed pitch, page_rows to a page, the page table on the host and on the device (attention's key
// lists and the indexer read through the device one, backend/cuda key_rows_ref and index_keys).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/cache_pack.cuh"
#include "backend/cuda/indexer.cuh"
#include "core/status.h"
#include "engine/cuda/device_model.h"
#include "engine/cuda/page_pool.h"

namespace ds41rt::engine::gpu {

class paged_rows {
public:
    paged_rows() = default;
    paged_rows(page_pool *pool, int64_t pitch, int64_t page_rows) : pool_(pool), pitch_(pitch), page_rows_(page_rows) {}

    int64_t rows() const { return rows_; }
    int64_t pitch() const { return pitch_; }
    int64_t page_rows() const { return page_rows_; }
    // Row i's bytes on the device (i < rows(), or the row an append is writing).
    uint8_t *row(int64_t i) const { return pages_[size_t(i / page_rows_)].get() + (i % page_rows_) * pitch_; }
    // The page tables: the device's (for kernels; stream-ordered, current after the last append)
    // and the host's (for pointers the host builds).
    const uint8_t *const *device_table() const { return dtable_.as<const uint8_t *const>(); }
    const uint8_t *const *host_table() const { return htable_.data(); }

    // Appends n rows: write(first, count, dst) fills the new rows [first, first + count) (first
    // counted from the first new row) at dst, count consecutive rows of one page; once per page
    // the new rows touch, in row order. A failed append leaves the rows as they were.
    using writer = std::function<Status(int64_t first, int64_t count, uint8_t *dst)>;
    Status append(const device_model &m, int64_t n, const writer &write);

private:
    page_pool *pool_ = nullptr;
    int64_t pitch_ = 0, page_rows_ = 0, rows_ = 0;
    std::vector<pool_page> pages_;
    std::vector<const uint8_t *> htable_;
    dtemp dtable_;
    size_t uploaded_ = 0;  // pages in dtable_
};

// Key rows as attention reads them (backend/cuda cache_pack key_rows_ref): fp32 rows, or packed
// cache records (V4.1's compressed entries: FP4 + E4M3 per 16, 288 bytes at head_dim 512 against
// 2048 as fp32), in pages.
struct key_store {
    paged_rows rows;
    int64_t width = 0;
    backend::cuda::key_format fmt = backend::cuda::key_format::F32;
    key_store() = default;
    key_store(page_pool *pool, int64_t width, backend::cuda::key_format fmt, int64_t page_rows);
    int64_t n() const { return rows.rows(); }
    backend::cuda::key_rows_ref ref() const;       // for kernels (the device page table)
    backend::cuda::key_rows_ref host_ref() const;  // for the host's pointers
    // Appends n rows of src (device [n, width]; for records, values on the format's grid already).
    Status append(const device_model &m, const float *src, int64_t n);
};

// An index source's keys (backend/cuda indexer index_keys): fp32 rows, or FP4 + E8M0 per 32
// records (68 bytes a V4.1 key against 512: the indexer FP4-quantizes every key, so packing is
// exact), in pages.
struct index_key_store {
    paged_rows rows;
    int64_t width = 0;
    bool fp4 = false;
    index_key_store() = default;
    index_key_store(page_pool *pool, int64_t width, bool fp4, int64_t page_rows);
    int64_t n() const { return rows.rows(); }
    backend::cuda::index_keys keys() const;
    // Appends n keys of src (device [n, width]; for FP4, values on the FP4 grid already).
    Status append(const device_model &m, const float *src, int64_t n);
};

}  // namespace ds41rt::engine::gpu
