#include "engine/cuda/v4_compressor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "backend/cuda/compressor.cuh"
#include "backend/cuda/cuda_status.h"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;

namespace {

// Drops the first k rows of r (the rest move to the front of a fresh buffer).
Status drop_front(const device_model &m, dev_rows &r, int64_t k) {
    const int64_t left = r.rows - k;
    if (left > 0) {
        dtemp nb = m.temp_f32(std::max<int64_t>(left, 16) * r.width);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(nb.f(), r.at(k), size_t(left * r.width) * sizeof(float),
                                                    cudaMemcpyDeviceToDevice, m.stream()));
        r.buf = std::move(nb);
        r.cap = std::max<int64_t>(left, 16);
    }
    r.rows = left;
    return Status::ok();
}

}  // namespace

Status v4_compress_pool(const device_model &m, const v4_compressor_shape &c, const std::vector<v4_open_windows *> &st,
                        const float *kv, const float *gate, const std::vector<int64_t> &off,
                        const std::vector<int64_t> &n, dtemp *latent, std::vector<int64_t> *groups) {
    const int64_t d = c.d, cd = (c.overlap ? 2 : 1) * d;
    const int ratio = c.ratio;
    if (ratio < 1 || d < 1 || !c.ape || st.size() != off.size() || st.size() != n.size())
        return Status::invalid_argument("v4_compress_pool: bad shape or arguments");
    groups->assign(st.size(), 0);
    // Buffer the rows; bias the gate rows of the windows that close (the host's += ape).
    for (size_t i = 0; i < st.size(); i++) {
        v4_open_windows &w = *st[i];
        w.kv.width = w.gate.width = cd;
        DS41RT_RETURN_IF_ERROR(m.append(w.kv, kv + off[i] * cd, n[i]));
        DS41RT_RETURN_IF_ERROR(m.append(w.gate, gate + off[i] * cd, n[i]));
        (*groups)[i] = w.kv.rows / ratio;
        DS41RT_RETURN_IF_ERROR(cuda::add_periodic_bias(w.gate.buf.f(), (*groups)[i] * ratio, cd, c.ape, ratio, m.stream()));
    }
    // The slots of every closing window, in v4::compress_pool's order.
    std::vector<const float *> skv, sgate;
    std::vector<int32_t> first{0};
    for (size_t i = 0; i < st.size(); i++) {
        v4_open_windows &w = *st[i];
        for (int64_t g = 0; g < (*groups)[i]; g++) {
            if (c.overlap) {
                if (g > 0 || w.has_prev)
                    for (int t = 0; t < ratio; t++) {
                        if (g > 0) {  // Ca = [:d] of the previous window's rows
                            skv.push_back(w.kv.at((g - 1) * ratio + t));
                            sgate.push_back(w.gate.at((g - 1) * ratio + t));
                        } else {
                            skv.push_back(w.prev_kv.f() + t * d);
                            sgate.push_back(w.prev_gate.f() + t * d);
                        }
                    }
                for (int t = 0; t < ratio; t++) {  // Cb = [d:]
                    skv.push_back(w.kv.at(g * ratio + t) + d);
                    sgate.push_back(w.gate.at(g * ratio + t) + d);
                }
            } else {
                for (int t = 0; t < ratio; t++) {
                    skv.push_back(w.kv.at(g * ratio + t));
                    sgate.push_back(w.gate.at(g * ratio + t));
                }
            }
            first.push_back(int32_t(skv.size()));
        }
    }
    const int64_t G = int64_t(first.size()) - 1;
    if (G == 0) return Status::ok();
    auto kv_d = m.upload_temp(skv.data(), skv.size() * sizeof(float *));
    if (!kv_d) return kv_d.status();
    auto gate_d = m.upload_temp(sgate.data(), sgate.size() * sizeof(float *));
    if (!gate_d) return gate_d.status();
    auto first_d = m.upload_temp(first.data(), first.size() * sizeof(int32_t));
    if (!first_d) return first_d.status();
    *latent = m.temp_f32(G * d);
    DS41RT_RETURN_IF_ERROR(cuda::compress_pool_slots(kv_d->as<const float *>(), gate_d->as<const float *>(),
                                                     first_d->as<int32_t>(), G, d, latent->f(), m.stream()));
    // Keep the last closed window's Ca half for the next call, then drop the closed windows' rows
    // (stream-ordered after the pooling that reads them).
    for (size_t i = 0; i < st.size(); i++) {
        v4_open_windows &w = *st[i];
        const int64_t gi = (*groups)[i];
        if (gi == 0) continue;
        if (c.overlap) {
            if (!w.prev_kv.bytes()) w.prev_kv = m.temp_f32(int64_t(ratio) * d), w.prev_gate = m.temp_f32(int64_t(ratio) * d);
            for (auto [dst, src] : {std::pair{&w.prev_kv, &w.kv}, std::pair{&w.prev_gate, &w.gate}})
                DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst->f(), size_t(d) * sizeof(float), src->at((gi - 1) * ratio),
                                                              size_t(cd) * sizeof(float), size_t(d) * sizeof(float),
                                                              size_t(ratio), cudaMemcpyDeviceToDevice, m.stream()));
            w.has_prev = true;
        }
        DS41RT_RETURN_IF_ERROR(drop_front(m, w.kv, gi * ratio));
        DS41RT_RETURN_IF_ERROR(drop_front(m, w.gate, gi * ratio));
    }
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
