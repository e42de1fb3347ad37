// The attention key lists of one step, shared by the V4.1 and V4 GPU forward passes: one list of
// key-row pointers per query row (all heads share it), as backend/cuda/attention takes them.
//
// A list is the row's window (ring rows older than the step's chunk, then the chunk's own rows,
// in position order), OFFICIAL's null pads up to the window width, then the compressed entries.
// The host tracks the ring positions. Where a sequence's rows pad their windows to one width
// (OFFICIAL) and the ring holds an unbroken run of the positions they see, its window half is
// written on the device from a few numbers (backend/cuda/key_list fill_key_rows); otherwise the
// host builds it. The compressed half is either host pointers (entries all visible, or
// TRANSFORMERS picks that came back) or, for OFFICIAL's picks, written on the device from the
// indexer's top-k, so the picks never come back inside a step. A step whose lists have no host
// pointers at all (V4.1 OFFICIAL decode) copies nothing from the host: one launch a layer writes
// them. Trailing nulls pad every list to one length; attention skips them and they change no
// block of the OFFICIAL online softmax.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/key_list.cuh"
#include "engine/cuda/device_model.h"
#include "engine/cuda/page_pool.h"

namespace ds41rt::engine::gpu {

// One layer's window ring of a sequence: W rows of head_dim in one pool page, fp32 or packed
// records (V4.1's window KV: FP8 + E8M0 per 32, 528 bytes a row at head_dim 512), and on the host
// the position each slot holds (-1: empty).
struct window_ring {
    pool_page rows;
    std::vector<int64_t> pos;
    backend::cuda::key_format fmt = backend::cuda::key_format::F32;
    backend::cuda::key_rows_ref ref(int64_t hd) const {
        return {rows.get(), backend::cuda::key_record_bytes(fmt, hd), fmt};
    }
};

// A sequence's window rings, one a layer of W empty slots of hd channels in fmt, each a page of
// pool; made by the sequence's first step (the rings stay empty until then, so a failure is a
// Status there). Nothing happens when the rings exist.
Status make_rings(std::vector<window_ring> &rings, page_pool &pool, int n_layers, int64_t W, int64_t hd,
                  backend::cuda::key_format fmt);

class key_lists {
public:
    // device_windows = false: every window half built on the host (for comparing).
    explicit key_lists(int64_t rows, bool device_windows = true)
        : host_(static_cast<size_t>(rows)), dcols_(static_cast<size_t>(rows), 0), device_windows_(device_windows) {}

    // Rows [o, o + n) of one sequence whose chunk starts at position p0: each row's window keys
    // (chunk: the chunk's own key rows on the device, [n, hd]), then nulls up to pad_to.
    void add_window(const window_ring &ring, int64_t W, int64_t hd, int64_t p0, int64_t o, int64_t n,
                    const float *chunk, int64_t pad_to);
    // Host pointers appended to row r.
    std::vector<const float *> &row(int64_t r) { return host_[size_t(r)]; }
    // Rows [o, o + n) end with k entries read on the device: entries.at(idx[r][j]) for the first
    // cnt[r] of them, nulls after (idx [n, k], cnt [n]: device int32). Every row of the range must
    // have the same number of host entries before them (OFFICIAL's padded window).
    Status add_device_picks(int64_t o, int64_t n, const int32_t *idx, const int32_t *cnt, int k,
                            backend::cuda::key_rows_ref entries);

    // The lists as a device array [rows, *L] (stream-ordered; no synchronisation).
    Result<dtemp> upload(const device_model &m, int64_t *L) const;

private:
    std::vector<std::vector<const float *>> host_;  // host columns, after the row's device columns
    std::vector<int64_t> dcols_;                    // a row's window columns written on the device
    std::vector<backend::cuda::key_row_seq> dev_;   // the device-written parts, in row order
    int64_t W_ = 0, hd_ = 0;
    bool device_windows_;
};

// The last min(n, W) rows of a sequence's chunk (device [n, hd], positions p0..) go to its ring,
// after attention has read them: store_windows does every sequence of a step in one launch (a
// copy, or for packed rings backend/cuda pack_fp8_records: the rows are on the FP8 grid already).
struct window_store {
    window_ring *ring;
    int64_t p0, n;
    const float *chunk;
};
Status store_windows(const device_model &m, const std::vector<window_store> &stores, int64_t W, int64_t hd);

}  // namespace ds41rt::engine::gpu
