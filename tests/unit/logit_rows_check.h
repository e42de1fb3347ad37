// What engine::step returns for each logit_rows choice, checked the same way on the CPU engine
// (tests/unit/logit_rows_test.cpp) and the GPU engine (tests/cuda_engine/gpu_logit_rows_test.cpp):
// three sequences with one prompt in one step, asking ALL, LAST and NONE; LAST must be ALL's last
// row bit for bit and NONE no rows, and the three states must continue alike (a decode step each,
// all asking LAST: the same bits). On the GPU engine the step is one batch, so LAST and NONE rows
// are gathered out of it before the head.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/synth.h"
#include "tiny_synth.h"

namespace ds41rt::testing_util {

inline void check_logit_rows(engine::engine &e) {
    const int64_t V = e.config().vocab_size;
    const std::vector<int32_t> prompt = {3, 141, 59, 26, 5, 358, 97, 93, 238, 46, 264, 33};
    engine::seq_id a = e.create_sequence(), b = e.create_sequence(), c = e.create_sequence();
    std::vector<Tensor> out;
    Status st = e.step({{a, prompt, engine::logit_rows::ALL}, {b, prompt, engine::logit_rows::LAST},
                        {c, prompt, engine::logit_rows::NONE}},
                       &out);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(out.size(), 3u);
    const int64_t T = int64_t(prompt.size());
    ASSERT_EQ(out[0].dim(0), T);
    ASSERT_EQ(out[1].dim(0), 1);
    ASSERT_EQ(out[2].dim(0), 0);
    ASSERT_EQ(out[1].dim(1), V);
    EXPECT_EQ(std::memcmp(out[1].data<float>(), out[0].data<float>() + (T - 1) * V, size_t(V) * sizeof(float)), 0)
        << "LAST is not ALL's last row";
    // The states continue alike whatever was returned.
    st = e.step({{a, {7}, engine::logit_rows::LAST}, {b, {7}, engine::logit_rows::LAST}, {c, {7}, engine::logit_rows::LAST}},
                &out);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(out.size(), 3u);
    for (int i = 1; i < 3; i++) {
        ASSERT_EQ(out[size_t(i)].dim(0), 1);
        EXPECT_EQ(std::memcmp(out[size_t(i)].data<float>(), out[0].data<float>(), size_t(V) * sizeof(float)), 0)
            << "sequence " << i << " decodes differently";
    }
    for (engine::seq_id s : {a, b, c}) e.free_sequence(s);
}

// The check on the tiny synthesized V4.1 model, opened with o; skips where o's backend is not
// available (no GPU).
inline void check_logit_rows_on_tiny_model(const engine::engine_options &o, const std::string &tag) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("ds41rt_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    Status st = model::synthesize(dir.string(), tiny_synth());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    auto e = engine::engine::open(dir.string(), o);
    if (!e && (e.status().code() == status_code::UNAVAILABLE || e.status().code() == status_code::NOT_SUPPORTED)) {
        fs::remove_all(dir);
        GTEST_SKIP() << e.status().to_string();
    }
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    check_logit_rows(**e);
    fs::remove_all(dir);
}

}  // namespace ds41rt::testing_util
