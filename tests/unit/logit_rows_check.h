// What engine::step returns for each logit_rows choice, checked the same way on the CPU engine
// (tests/unit/logit_rows_test.cpp) and the GPU engine (tests/cuda_engine/gpu_logit_rows_test.cpp):
// three sequences with one prompt in one step, asking ALL, LAST and NONE; LAST must be ALL's last
// row bit for bit and NONE no rows, and the three states must continue alike (a decode step each,
// all asking LAST: the same bits). On the GPU engine the step is one batch, so LAST and NONE rows
// are gathered out of it before the head. And SAMPLE rows (check_sampled_step): the engine's picks
// are the host sampler's from the same rows; steps issued ahead (check_issued_steps) pick what
// step_sampled picks.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
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

// Rows sampled by the engine (engine::step_sampled), one chain each: greedy, penalties,
// temperature with top_p / top_k / min_p, a grammar mask (and one shorter than the vocabulary),
// logprobs with top alternatives. The draws' seeds differ; positions and counts are set per step.
inline std::vector<engine::sample_spec> sample_chains() {
    std::vector<engine::sample_spec> v(7);
    v[1].p.frequency_penalty = 2.0f;
    v[1].p.presence_penalty = 1.0f;
    v[2].p.greedy = false;
    v[2].p.inv_temperature = 1.0f / 0.8f;
    v[2].p.top_p = 0.9f;
    v[2].logprobs = true;
    v[2].top_logprobs = 5;
    v[3].p.greedy = false;
    v[3].p.inv_temperature = 1.0f / 1.2f;
    v[3].p.top_k = 20;
    v[3].p.log_min_p = backend::cpu::sampling_log_min_p(0.05f);
    v[4].p.greedy = false;
    v[4].allowed.assign(16, 0u);  // tokens 96..159
    v[4].allowed[3] = v[4].allowed[4] = 0xFFFFFFFFu;
    v[4].logprobs = true;
    v[4].top_logprobs = 3;
    v[5].p.greedy = false;
    v[5].p.inv_temperature = 1.0f / 0.7f;
    v[5].p.presence_penalty = -0.5f;
    v[5].logprobs = true;
    v[5].top_logprobs = 20;
    v[6].allowed = {0u, 0x3u};  // tokens 32 and 33; the rest of the vocabulary past the mask
    for (size_t i = 0; i < v.size(); i++) v[i].seed = 1000 + i;
    return v;
}

// step_sampled against the host's picks from the same rows: `ref` sequences step with LAST rows
// (their logits come back), `dev` sequences with the same tokens in a step of the same shape ask
// SAMPLE (the GPU engine picks on the device: only tokens come back). Each pick must be
// sample_on_host's from the ref row, the logprobs within 1e-5 (fp64 log-sum-exp on both sides),
// for four steps (prompt and three decodes: positions 0..3, counts growing as the scheduler's).
// Then a step mixing a LAST and a SAMPLE row (the host picks there, from the returned rows), and
// plain step() on a SAMPLE row (it returns the row, as LAST).
inline void check_sampled_step(engine::engine &e) {
    const int64_t V = e.config().vocab_size;
    std::vector<engine::sample_spec> chains = sample_chains();
    const size_t k = chains.size();
    const std::vector<int32_t> prompt = {3, 141, 59, 26, 5, 358, 97, 93, 238, 46, 264, 33};
    std::vector<engine::step_input> ref, dev;
    for (size_t i = 0; i < k; i++) {
        ref.push_back({e.create_sequence(), prompt, engine::logit_rows::LAST});
        dev.push_back({e.create_sequence(), prompt, engine::logit_rows::SAMPLE, chains[i]});
    }
    std::vector<Tensor> rows, out;
    std::vector<engine::sample_result> picks;
    int distinct = 0;
    for (int64_t pos = 0; pos < 4; pos++) {
        Status st = e.step(ref, &rows);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        st = e.step_sampled(dev, &out, &picks);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        ASSERT_EQ(rows.size(), k);
        ASSERT_EQ(out.size(), k);
        ASSERT_EQ(picks.size(), k);
        std::vector<int32_t> seen;
        for (size_t i = 0; i < k; i++) {
            ASSERT_EQ(rows[i].dim(0), 1);
            EXPECT_EQ(out[i].dim(0), 0) << "a SAMPLE row's logits came back";
            const engine::sample_result want =
                engine::sample_on_host({rows[i].data<float>(), size_t(V)}, dev[i].sample);
            const engine::sample_result &got = picks[i];
            EXPECT_EQ(got.token, want.token) << "chain " << i << " position " << pos;
            if (dev[i].sample.logprobs) {
                EXPECT_NEAR(got.logprob, want.logprob, 1e-5) << "chain " << i;
                ASSERT_EQ(got.top.size(), want.top.size()) << "chain " << i;
                for (size_t j = 0; j < want.top.size(); j++) {
                    EXPECT_EQ(got.top[j].id, want.top[j].id) << "chain " << i << " alternative " << j;
                    EXPECT_NEAR(got.top[j].logprob, want.top[j].logprob, 1e-5);
                }
            }
            if (std::find(seen.begin(), seen.end(), want.token) == seen.end()) seen.push_back(want.token);
            // The next step feeds the host's pick to both, so they stay alike.
            const int32_t t = want.token;
            ref[i].tokens = {t};
            dev[i].tokens = {t};
            dev[i].sample.position = pos + 1;
            auto c = std::find_if(dev[i].sample.counts.begin(), dev[i].sample.counts.end(),
                                  [&](const backend::cpu::token_count &x) { return x.token == t; });
            if (c == dev[i].sample.counts.end()) dev[i].sample.counts.push_back({t, 1});
            else c->count++;
        }
        EXPECT_TRUE(picks[4].token >= 96 && picks[4].token < 160) << picks[4].token;
        EXPECT_TRUE(picks[6].token == 32 || picks[6].token == 33) << picks[6].token;
        distinct = std::max(distinct, int(seen.size()));
    }
    EXPECT_GE(distinct, 3) << "the chains picked alike: the check would not tell them apart";

    // LAST and SAMPLE in one step_sampled: ref[2]'s row comes back, dev[2] is picked from its own.
    Status st = e.step_sampled({ref[2], dev[2]}, &out, &picks);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(out.size(), 2u);
    ASSERT_EQ(out[0].dim(0), 1);
    EXPECT_EQ(out[1].dim(0), 0);
    EXPECT_EQ(picks[0].token, -1);
    EXPECT_EQ(picks[1].token, engine::sample_on_host({out[0].data<float>(), size_t(V)}, dev[2].sample).token);
    // Plain step() returns a SAMPLE row as it would a LAST one.
    st = e.step({dev[3]}, &out);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].dim(0), 1);
    for (auto &in : ref) e.free_sequence(in.seq);
    for (auto &in : dev) e.free_sequence(in.seq);
}

// Steps issued ahead (engine::issue_sampled / collect_sampled) against step_sampled with the picks
// fed back by the host: three sequences (greedy; temperature with top_p and logprobs; temperature
// with top_k and min_p), a prompt and seven decode steps, each decode step issued with
// PREVIOUS_PICK tokens before the previous step's picks are collected. The tokens (and logprobs)
// must be the same, step for step. Then the refusals: a PREVIOUS_PICK of a sequence that has no
// pick, a collect with nothing issued.
inline void check_issued_steps(engine::engine &e) {
    // sample_chains' greedy, top_p and top_k / min_p chains: the ones without penalties or masks,
    // whose counts and masks the caller could not know before a pick reaches the host.
    const std::vector<engine::sample_spec> all = sample_chains();
    const std::vector<engine::sample_spec> chains = {all[0], all[2], all[3]};
    const std::vector<int32_t> prompt = {3, 141, 59, 26, 5, 358, 97, 93, 238, 46, 264, 33};
    constexpr int STEPS = 8;  // the prompt, then seven decode steps
    const size_t k = chains.size();
    auto inputs = [&](const std::vector<engine::seq_id> &seqs, int step, const std::vector<int32_t> *last) {
        std::vector<engine::step_input> in;
        for (size_t i = 0; i < k; i++) {
            engine::sample_spec sp = chains[i];
            sp.position = step;
            std::vector<int32_t> t = step == 0 ? prompt : std::vector<int32_t>{last ? (*last)[i] : engine::PREVIOUS_PICK};
            in.push_back({seqs[i], t, engine::logit_rows::SAMPLE, sp});
        }
        return in;
    };
    // Reference: each step's picks to the host, then fed back.
    std::vector<engine::seq_id> ref, ahead;
    for (size_t i = 0; i < k; i++) ref.push_back(e.create_sequence()), ahead.push_back(e.create_sequence());
    std::vector<std::vector<engine::sample_result>> want;
    std::vector<Tensor> logits;
    std::vector<int32_t> last;
    for (int step = 0; step < STEPS; step++) {
        std::vector<engine::sample_result> picks;
        Status st = e.step_sampled(inputs(ref, step, step ? &last : nullptr), &logits, &picks);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        last.clear();
        for (const auto &p : picks) last.push_back(p.token);
        want.push_back(std::move(picks));
    }
    // Ahead: step N + 1 issued before step N is collected.
    std::vector<std::vector<engine::sample_result>> got;
    for (int step = 0; step < STEPS; step++) {
        Status st = e.issue_sampled(inputs(ahead, step, nullptr));
        ASSERT_TRUE(st.is_ok()) << "issue " << step << ": " << st.to_string();
        if (step == 0) continue;
        std::vector<engine::sample_result> picks;
        st = e.collect_sampled(&picks);
        ASSERT_TRUE(st.is_ok()) << "collect " << step - 1 << ": " << st.to_string();
        got.push_back(std::move(picks));
    }
    std::vector<engine::sample_result> picks;
    Status st = e.collect_sampled(&picks);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    got.push_back(std::move(picks));
    ASSERT_EQ(got.size(), want.size());
    int differ = 0;
    for (size_t s = 0; s < want.size(); s++) {
        ASSERT_EQ(got[s].size(), k);
        for (size_t i = 0; i < k; i++) {
            EXPECT_EQ(got[s][i].token, want[s][i].token) << "step " << s << " chain " << i;
            EXPECT_EQ(got[s][i].logprob, want[s][i].logprob) << "step " << s << " chain " << i;
            differ += got[s][i].token != want[s][0].token;
        }
    }
    EXPECT_GT(differ, 0) << "every chain drew the greedy tokens: the sampled chains check nothing";
    st = e.collect_sampled(&picks);
    EXPECT_EQ(st.code(), status_code::INVALID_ARGUMENT) << "a collect with nothing issued: " << st.to_string();
    const engine::seq_id fresh = e.create_sequence();
    st = e.issue_sampled({{fresh, {engine::PREVIOUS_PICK}, engine::logit_rows::SAMPLE, chains[0]}});
    EXPECT_EQ(st.code(), status_code::INVALID_ARGUMENT) << "a PREVIOUS_PICK with no pick: " << st.to_string();
    for (engine::seq_id s : ref) e.free_sequence(s);
    for (engine::seq_id s : ahead) e.free_sequence(s);
    e.free_sequence(fresh);
}

// A check on the tiny synthesized V4.1 model, opened with o; skips where o's backend is not
// available (no GPU).
template <class Check>
inline void on_tiny_model(const engine::engine_options &o, const std::string &tag, Check &&check) {
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
    check(**e);
    fs::remove_all(dir);
}

}  // namespace ds41rt::testing_util
