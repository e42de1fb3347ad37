#include "engine/cuda/key_lists.h"

#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/key_list.cuh"

namespace ds41rt::engine::gpu {

void key_lists::add_window(const window_ring &ring, int64_t W, int64_t hd, int64_t p0, int64_t o, int64_t n,
                           const float *chunk, int64_t pad_to) {
    std::vector<std::pair<int64_t, const float *>> wk;
    for (int64_t p = std::max<int64_t>(0, p0 - W); p < p0; p++)
        if (ring.pos[size_t(p % W)] == p) wk.push_back({p, ring.rows.f() + (p % W) * hd});
    for (int64_t s = 0; s < n; s++) wk.push_back({p0 + s, chunk + s * hd});
    for (int64_t s = 0; s < n; s++) {
        auto &keys = host_[size_t(o + s)];
        const int64_t p = p0 + s;
        for (auto &[kp, ptr] : wk)
            if (kp <= p && kp > p - W) keys.push_back(ptr);
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
    size_t Lmax = 0;
    for (const auto &h : host_) Lmax = std::max(Lmax, h.size());
    for (const picks &p : dev_) Lmax = std::max(Lmax, size_t(p.col0 + p.k));
    const size_t R = host_.size();
    std::vector<const float *> flat(R * Lmax, nullptr);
    for (size_t r = 0; r < R; r++) std::copy(host_[r].begin(), host_[r].end(), flat.begin() + r * Lmax);
    auto keys = m.upload_temp(flat.data(), std::max<size_t>(flat.size(), 1) * sizeof(const float *));
    if (!keys) return keys.status();
    const float **base = keys->as<const float *>();
    for (const picks &p : dev_)
        DS41RT_RETURN_IF_ERROR(backend::cuda::fill_pick_keys(base + p.o * int64_t(Lmax), int64_t(Lmax), p.col0, p.idx,
                                                             p.cnt, p.n, p.k, p.entries, p.hd, m.stream()));
    *L = int64_t(Lmax);
    return std::move(keys.value());
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
