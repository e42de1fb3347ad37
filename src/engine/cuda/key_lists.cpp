#include "engine/cuda/key_lists.h"

#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/key_list.cuh"

namespace ds41rt::engine::gpu {

void key_lists::add_window(const window_ring &ring, int64_t W, int64_t hd, int64_t p0, int64_t o, int64_t n,
                           const float *chunk, int64_t pad_to) {
    // Row s (position p = p0 + s) sees positions (p - W, p]: ring rows before the chunk (only
    // slots that still hold their position) and the chunk's own rows, in position order. Linear
    // in n * W: an 8192-token chunk is 1M pointers.
    const int64_t r0 = std::max<int64_t>(0, p0 - W);
    std::vector<const float *> before(size_t(p0 - r0), nullptr);
    for (int64_t p = r0; p < p0; p++)
        if (ring.pos[size_t(p % W)] == p) before[size_t(p - r0)] = ring.rows.f() + (p % W) * hd;
    for (int64_t s = 0; s < n; s++) {
        auto &keys = host_[size_t(o + s)];
        const int64_t p = p0 + s, first = std::max<int64_t>(0, p - W + 1);
        keys.reserve(keys.size() + size_t(std::max(W, pad_to)));
        for (int64_t q = first; q < p0; q++)
            if (before[size_t(q - r0)]) keys.push_back(before[size_t(q - r0)]);
        for (int64_t q = std::max(first, p0); q <= p; q++) keys.push_back(chunk + (q - p0) * hd);
        while (int64_t(keys.size()) < pad_to) keys.push_back(nullptr);
    }
}

Status key_lists::add_device_picks(int64_t o, int64_t n, const int32_t *idx, const int32_t *cnt, int k,
                                   const float *entries, int64_t hd) {
    if (n <= 0 || k <= 0) return Status::ok();
    const int64_t col0 = int64_t(host_[size_t(o)].size());
    for (int64_t r = o; r < o + n; r++)
        if (int64_t(host_[size_t(r)].size()) != col0)
            return Status::internal("key lists: device picks after host lists of different lengths");
    dev_.push_back({o, n, col0, hd, idx, cnt, k, entries});
    return Status::ok();
}

Result<dtemp> key_lists::upload(const device_model &m, int64_t *L) const {
    size_t Lh = 0;  // the longest host list
    for (const auto &h : host_) Lh = std::max(Lh, h.size());
    size_t Lmax = Lh;
    for (const picks &p : dev_) Lmax = std::max(Lmax, size_t(p.col0 + p.k));
    const size_t R = host_.size();
    dtemp keys = m.temp(std::max<size_t>(R * Lmax, 1) * sizeof(const float *));
    const float **base = keys.as<const float *>();
    // Only the host's columns travel (a prefill's device picks are most of the array: 512 of 640
    // columns); the rest starts as nullptr and the picks are written over it on the device.
    if (Lmax > Lh) DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(base, 0, R * Lmax * sizeof(const float *), m.stream()));
    if (Lh > 0) {
        std::vector<const float *> flat(R * Lh, nullptr);
        for (size_t r = 0; r < R; r++) std::copy(host_[r].begin(), host_[r].end(), flat.begin() + r * Lh);
        // From pageable memory: staged before the call returns, as device_model::to_device.
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(base, Lmax * sizeof(const float *), flat.data(), Lh * sizeof(const float *),
                                                      Lh * sizeof(const float *), R, cudaMemcpyHostToDevice, m.stream()));
    }
    for (const picks &p : dev_)
        DS41RT_RETURN_IF_ERROR(backend::cuda::fill_pick_keys(base + p.o * int64_t(Lmax), int64_t(Lmax), p.col0, p.idx,
                                                             p.cnt, p.n, p.k, p.entries, p.hd, m.stream()));
    *L = int64_t(Lmax);
    return keys;
}

Status store_window(const device_model &m, window_ring &ring, int64_t W, int64_t hd, int64_t p0, int64_t n,
                    const float *chunk) {
    for (int64_t s = std::max<int64_t>(0, n - W); s < n; s++) {
        const int64_t slot = (p0 + s) % W;
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ring.rows.f() + slot * hd, chunk + s * hd, size_t(hd) * sizeof(float),
                                                    cudaMemcpyDeviceToDevice, m.stream()));
    }
    for (int64_t s = 0; s < n; s++) ring.pos[size_t((p0 + s) % W)] = p0 + s;
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
