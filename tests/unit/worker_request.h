// What the expert-worker tests send a worker and how they read its answer: rows x ~ N(0, 1) with
// two routes a row (experts (3 r + 5 k) mod E, weights 0.3 and 0.4), and the partial a worker
// answers for one layer of them through its frame handler (no transport). Shared by
// tests/unit/remote_experts_test (CPU workers) and tests/cuda_engine's dummy and GPU worker tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/routed.h"
#include "core/status.h"
#include "dist/plan.h"
#include "dist/wire.h"
#include "dist/worker.h"

namespace ds41rt {

struct worker_rows {
    std::vector<float> x;  // [rows, D]
    backend::cpu::route_table rt;
};

// x drawn from rng first, then the routes (which draw nothing).
inline worker_rows two_route_rows_of(std::mt19937 &rng, int64_t rows, int64_t D, uint32_t experts) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    worker_rows in;
    in.x.resize(static_cast<size_t>(rows * D));
    for (float &v : in.x) v = nd(rng);
    in.rt.offsets.push_back(0);
    for (int64_t r = 0; r < rows; r++) {
        for (int k = 0; k < 2; k++) in.rt.routes.push_back({uint32_t((r * 3 + k * 5) % experts), 0.3f + 0.1f * k});
        in.rt.offsets.push_back(uint32_t(in.rt.routes.size()));
    }
    return in;
}

// The partial worker w answers for `layer` of in (its placement version taken from plan).
inline Result<std::vector<float>> worker_partial(dist::expert_worker &w, const dist::Plan &plan, int layer, bool official,
                                                 const worker_rows &in, int64_t D) {
    dist::frame_header h;
    h.placement_version = plan.version();
    h.layer = uint32_t(layer);
    if (official) h.flags |= dist::FLAG_OFFICIAL;
    bool close_after = false;
    auto r = dist::decode_response(w.handle(dist::encode_request(h, in.rt, in.x.data(), uint32_t(D)), &close_after));
    if (!r) return r.status();
    return std::move(r->partial);
}

}  // namespace ds41rt
