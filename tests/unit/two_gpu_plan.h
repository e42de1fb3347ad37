// The placement of the local-GPU tests (tests/unit/local_gpus_test, tests/cuda_engine/
// local_gpus_test): the tiny synthesized V4.1 model's 12 layers with 0-5's experts on coordinator
// GPU 0 and 6-11's on GPU 1, no workers (what `ds41rt plan --gpus 2` writes); and what they and
// the worker tests (tests/cuda_engine/gpu_worker_test, nccl_worker_test) compare: a greedy run
// (the prompt, then greedy steps, every step's logits appended) and the largest logit distance.
#pragma once

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/status.h"
#include "dist/plan.h"
#include "engine/engine.h"

namespace ds41rt {

inline dist::Plan two_gpu_plan() {
    dist::Plan p;
    p.model_type = "deepseek_v41";
    p.format = "official";
    p.num_layers = 12;
    p.coordinator.push_back({"gpu0", 0, {}});
    p.coordinator.push_back({"gpu1", 0, {}});
    for (int l = 0; l < 12; l++) p.layers.push_back({l, false, l < 6 ? 0 : 1, {}});
    return p;
}

// `steps` steps of a new sequence, the prompt first: every step's logits appended to *all, its
// greedy token to *greedy. The first failing step's status (the callers add their workers' logs).
inline Status run_greedy(engine::engine &e, int steps, std::vector<float> *all, std::vector<int32_t> *greedy,
                         std::vector<int32_t> prompt = {0, 17, 300, 42, 5, 511, 77, 9, 123, 64}) {
    engine::seq_id s = e.create_sequence();
    std::vector<int32_t> tokens = std::move(prompt);
    for (int step = 0; step < steps; step++) {
        std::vector<Tensor> logits;
        DS41RT_RETURN_IF_ERROR(e.step({{s, tokens}}, &logits));
        const Tensor &l = logits[0];
        all->insert(all->end(), l.f(), l.f() + l.numel());
        const int64_t V = l.dim(1);
        const float *last = l.f() + (l.dim(0) - 1) * V;
        tokens = {int32_t(std::max_element(last, last + V) - last)};
        greedy->push_back(tokens[0]);
    }
    return Status::ok();
}

// max |b - a| / max |a|, a the reference: relative to the largest |logit| rather than element by
// element, since a logit near zero has no relative precision to speak of.
inline double rel_max(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(a[i])));
    }
    return num / den;
}

}  // namespace ds41rt
