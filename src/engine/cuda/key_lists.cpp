#include "engine/cuda/key_lists.h"

#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/key_list.cuh"

namespace ds41rt::engine::gpu {

void key_lists::add_window(const window_ring &ring, int64_t W, int64_t hd, int64_t p0, int64_t o, int64_t n,
                           const float *chunk, int64_t pad_to) {
    // Row s (position p = p0 + s) sees positions (p - W, p]: ring rows before the chunk (only
    // slots that still hold their position) and the chunk's own rows, in position order.
    const int64_t r0 = std::max<int64_t>(0, p0 - W);
    W_ = W, hd_ = hd;
    if (device_windows_ && n > 0 && pad_to >= std::min(W, p0 + n)) {
        // On the device when the positions the rows see that the ring holds are one run [lo, p0).
        const int64_t seen = std::max<int64_t>(0, p0 - W + 1);
        int64_t lo = p0;
        while (lo > seen && ring.pos[size_t((lo - 1) % W)] == lo - 1) lo--;
        bool run = true;
        for (int64_t q = seen; q < lo && run; q++) run = ring.pos[size_t(q % W)] != q;
        if (run) {
            backend::cuda::key_row_seq d;
            d.ring = ring.ref(hd), d.chunk = chunk, d.p0 = p0, d.lo = lo, d.o = o, d.n = n, d.pad = pad_to;
            dev_.push_back(d);
            for (int64_t s = 0; s < n; s++) dcols_[size_t(o + s)] = pad_to;
            return;
        }
    }
    // On the host: linear in n * W (an 8192-token chunk is 1M pointers).
    std::vector<const float *> before(size_t(p0 - r0), nullptr);
    for (int64_t p = r0; p < p0; p++)
        if (ring.pos[size_t(p % W)] == p) before[size_t(p - r0)] = ring.ref(hd).at(p % W);
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
                                   backend::cuda::key_rows_ref entries) {
    if (n <= 0 || k <= 0) return Status::ok();
    const int64_t col0 = dcols_[size_t(o)] + int64_t(host_[size_t(o)].size());
    for (int64_t r = o; r < o + n; r++)
        if (dcols_[size_t(r)] + int64_t(host_[size_t(r)].size()) != col0)
            return Status::internal("key lists: device picks after lists of different lengths");
    // The picks join the rows' window part when it is written on the device and nothing follows
    // it; else they are a part of their own (the host's columns before them).
    if (!dev_.empty() && dev_.back().o == o && dev_.back().n == n && dev_.back().k == 0 && col0 == dev_.back().pad) {
        backend::cuda::key_row_seq &d = dev_.back();
        d.idx = idx, d.cnt = cnt, d.entries = entries, d.k = k;
        return Status::ok();
    }
    for (const auto &d : dev_)
        if (d.o < o + n && o < d.o + d.n)
            return Status::internal("key lists: device picks over rows whose device part has host columns after it");
    backend::cuda::key_row_seq d;
    d.o = o, d.n = n, d.pad = col0, d.idx = idx, d.cnt = cnt, d.entries = entries, d.k = k;
    dev_.push_back(d);
    return Status::ok();
}

Result<dtemp> key_lists::upload(const device_model &m, int64_t *L) const {
    const size_t R = host_.size();
    size_t Lh = 0, Lmax = 0;  // the longest list with its host columns; the longest of all
    bool any_host = false;
    for (size_t r = 0; r < R; r++) {
        Lh = std::max(Lh, size_t(dcols_[r]) + host_[r].size());
        any_host = any_host || !host_[r].empty();
    }
    Lmax = Lh;
    size_t covered = 0;  // rows a device part writes whole (window or picks)
    for (const auto &d : dev_) {
        Lmax = std::max(Lmax, size_t(d.pad + d.k));
        covered += size_t(d.n);
    }
    dtemp keys = m.temp(std::max<size_t>(R * Lmax, 1) * sizeof(const float *));
    const float **base = keys.as<const float *>();
    // Host columns travel as one [R, Lh] block, nulls where the device writes or nothing is; the
    // rest starts as null (the picks are written over it on the device). A step with no host
    // columns copies nothing: the device parts write their rows whole.
    const bool tail = !any_host && covered == R;
    if (!tail && Lmax > Lh)
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(base, 0, R * Lmax * sizeof(const float *), m.stream()));
    if (!tail && Lh > 0) {
        std::vector<const float *> flat(R * Lh, nullptr);
        for (size_t r = 0; r < R; r++) std::copy(host_[r].begin(), host_[r].end(), flat.begin() + r * Lh + dcols_[r]);
        // From pageable memory: staged before the call returns, as device_model::to_device.
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(base, Lmax * sizeof(const float *), flat.data(), Lh * sizeof(const float *),
                                                      Lh * sizeof(const float *), R, cudaMemcpyHostToDevice, m.stream()));
    }
    if (!dev_.empty())
        DS41RT_RETURN_IF_ERROR(
            backend::cuda::fill_key_rows(base, int64_t(Lmax), dev_.data(), int(dev_.size()), W_, hd_, tail, m.stream()));
    *L = int64_t(Lmax);
    return keys;
}

Status make_rings(std::vector<window_ring> &rings, page_pool &pool, int n_layers, int64_t W, int64_t hd,
                  backend::cuda::key_format fmt) {
    if (!rings.empty()) return Status::ok();
    const int64_t bytes = W * backend::cuda::key_record_bytes(fmt, hd);
    std::vector<window_ring> made(static_cast<size_t>(n_layers));
    for (window_ring &r : made) {
        Result<uint8_t *> p = pool.take(bytes);
        if (!p) return p.status();
        r.rows = pool_page(&pool, *p, bytes);
        r.pos.assign(size_t(W), -1);
        r.fmt = fmt;
    }
    rings = std::move(made);
    return Status::ok();
}

Status store_windows(const device_model &m, const std::vector<window_store> &stores, int64_t W, int64_t hd) {
    std::vector<backend::cuda::float_copy> copies;
    std::vector<backend::cuda::row_pack> packs;
    backend::cuda::key_format fmt = backend::cuda::key_format::F32;  // the packed rings' (one per step)
    for (const window_store &w : stores)
        if (w.ring->fmt != backend::cuda::key_format::F32) fmt = w.ring->fmt;
    for (const window_store &w : stores)
        for (int64_t s = std::max<int64_t>(0, w.n - W); s < w.n; s++) {
            const int64_t p = w.p0 + s;
            if (w.ring->fmt == backend::cuda::key_format::F32)
                copies.push_back({w.chunk + s * hd, reinterpret_cast<float *>(w.ring->rows.get()) + (p % W) * hd, hd});
            else if (w.ring->fmt == fmt)
                packs.push_back({w.chunk + s * hd, w.ring->rows.get() + (p % W) * w.ring->ref(hd).pitch});
            else
                return Status::internal("store_windows: window rings of two packed formats in one step");
            w.ring->pos[size_t(p % W)] = p;
        }
    DS41RT_RETURN_IF_ERROR(backend::cuda::copy_floats(copies.data(), int(copies.size()), m.stream()));
    return backend::cuda::pack_fp8_records(packs.data(), int(packs.size()), hd, fmt, m.stream());
}

}  // namespace ds41rt::engine::gpu
