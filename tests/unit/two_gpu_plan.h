// The placement of the local-GPU tests (tests/unit/local_gpus_test, tests/cuda_engine/
// local_gpus_test): the tiny synthesized V4.1 model's 12 layers with 0-5's experts on coordinator
// GPU 0 and 6-11's on GPU 1, no workers (what `ds41rt plan --gpus 2` writes), and the run both
// compare: the prompt, then greedy steps, every step's logits appended.
#pragma once

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

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

inline void run_greedy(engine::engine &e, int steps, std::vector<float> *all, std::vector<int32_t> *greedy) {
    engine::seq_id s = e.create_sequence();
    std::vector<int32_t> tokens = {0, 17, 300, 42, 5, 511, 77, 9, 123, 64};
    for (int step = 0; step < steps; step++) {
        std::vector<Tensor> logits;
        Status st = e.step({{s, tokens}}, &logits);
        ASSERT_TRUE(st) << st.to_string();
        const Tensor &l = logits[0];
        all->insert(all->end(), l.f(), l.f() + l.numel());
        const int64_t V = l.dim(1);
        const float *last = l.f() + (l.dim(0) - 1) * V;
        tokens = {int32_t(std::max_element(last, last + V) - last)};
        greedy->push_back(tokens[0]);
    }
}

}  // namespace ds41rt
