// The host-side bookkeeping the decode GEMVs share (gemv, nvfp4_gemv, exl3_gemv): how many K
// slices an output unit gets so one launch fills the device in one wave, and the workspace they
// all lay out the same way: [split-K counters][split-K partials][prepared x, one per distinct x].
//
// Why one wave: the GEMVs stream weights once; a second, partial wave would run at a fraction of
// the occupancy, each item paying its first loads' latency again. The resident count comes from
// the device (occupancy of the kernel instance), never from a baked-in SM count.
//
// Thread safety: pure functions; resident_blocks queries the runtime (callers cache it).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace ds41rt::backend::cuda::splitk {

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Token tiles of 8 rows: 1 for M <= 8, 2 up to 16 (the largest M of the batch decides).
template <class Mat>
int token_tiles(const std::vector<Mat> &mats) {
    int max_m = 1;
    for (const Mat &m : mats) max_m = std::max(max_m, m.M);
    return max_m > 8 ? 2 : 1;
}

// Resident CTAs per SM of `kernel` at `threads` threads and `smem` dynamic shared bytes (1 if
// the query fails).
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, size_t smem = 0) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess || n < 1) n = 1;
    return n;
}

// Slices wanted per output unit: the units the device holds at once over those in the batch.
inline int slices_wanted(long resident_units, long total_units) {
    return int(std::max<long>(1, resident_units / std::max<long>(1, total_units)));
}

// Length of each of ks slices of len K steps, rounded up to a multiple of align. A run recomputes
// it from the plan's ks with this same function.
inline int slice_len(int len, int ks, int align = 1) { return ((len + ks - 1) / ks + align - 1) / align * align; }

// K slices for len steps: at most want and cap, none shorter than min_len (one slice if len is
// shorter), then as few as the rounded slice length needs.
inline int slice_count(int len, int want, int min_len, int align = 1, int cap = 1 << 30) {
    const int ks = std::max(1, std::min({want, cap, len / min_len}));
    const int per = slice_len(len, ks, align);
    return (len + per - 1) / per;
}

// Sizes of the split-K part of a workspace: one counter per split output unit, ks partial slots
// of slot_floats floats per split unit.
struct workspace_layout {
    size_t counters = 0, partials = 0;  // unsigned counters, floats
    void add(size_t units, int ks, size_t slot_floats) {
        if (ks <= 1) return;
        counters += units;
        partials += units * size_t(ks) * slot_floats;
    }
    size_t counters_bytes() const { return align256(counters * sizeof(unsigned)); }
    size_t x_begin() const { return counters_bytes() + align256(partials * sizeof(float)); }
};

// Byte offsets of each matrix's prepared x, from `off` on: a matrix whose x is `same` as an
// earlier one's reuses its region. Returns the end of the last region (the workspace size).
template <class Mat, class Same, class Bytes>
size_t place_x(const std::vector<Mat> &mats, size_t off, Same same, Bytes bytes, std::vector<size_t> *x_offset) {
    for (size_t i = 0; i < mats.size(); i++) {
        size_t mine = off;
        for (size_t k = 0; k < i; k++)
            if (same(mats[k], mats[i])) mine = (*x_offset)[k];
        x_offset->push_back(mine);
        if (mine == off) off += bytes(mats[i]);
    }
    return off;
}

// Whether matrix i is the first to use its x region (the one that prepares it).
inline bool first_use(const std::vector<size_t> &x_offset, size_t i) {
    for (size_t k = 0; k < i; k++)
        if (x_offset[k] == x_offset[i]) return false;
    return true;
}

}  // namespace ds41rt::backend::cuda::splitk
