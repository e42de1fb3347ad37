// The scheduler with the real CPU engine on the tiny fixtures (tests/fixtures/deepseek-v41-flash-quant,
// deepseek-v4-flash-quant):
//  - greedy output equals the engine's own greedy continuation (and the fixture's gen.ids);
//  - a prompt prefilled in small chunks under a small step budget gives the same output;
//  - several requests running together give what each gives alone (greedy and seeded);
//  - the same seed reproduces a sampled output, another seed changes it;
//  - cancellation (running and queued) ends the request and frees its sequence;
//  - a full queue rejects with RESOURCE_EXHAUSTED; prompt + max_tokens over the context is EXCEEDS_CONTEXT;
//  - max_tokens ends with LENGTH, a stop string or stop token with STOP and its text withheld;
//  - a grammar (XGrammar JSON schema) constrains greedy and sampled output and ends it at EOS.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "engine/engine.h"
#include "io/safetensors.h"
#include "serving/scheduler.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

using namespace ds41rt;
using namespace ds41rt::serving;
namespace fs = std::filesystem;

namespace {

struct outcome {
    std::vector<int32_t> tokens;
    std::string text;
    finish_reason reason = finish_reason::NONE;
    int64_t completion_tokens = 0;
    Status error;
};

// Collects one request's events; wait() blocks until its final event.
struct collector {
    std::shared_ptr<outcome> out = std::make_shared<outcome>();
    std::shared_ptr<std::promise<void>> done = std::make_shared<std::promise<void>>();
    std::shared_future<void> fut = done->get_future().share();

    event_callback callback() {
        auto o = out;
        auto d = done;
        return [o, d](const generation_event &ev) {
            if (ev.token >= 0) o->tokens.push_back(ev.token);
            o->text += ev.text;
            if (ev.finished) {
                o->reason = ev.reason;
                o->completion_tokens = ev.completion_tokens;
                o->error = ev.error;
                d->set_value();
            }
        };
    }
    bool wait(int seconds = 60) { return fut.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready; }
};

std::vector<int32_t> ids_of(const io::safetensors_file &f, const std::string &name) {
    Tensor t = f.get(name).value();
    return std::vector<int32_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

int32_t argmax(const float *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return int32_t(best);
}

class SchedulerFixture : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        dir_ = fs::path(DS41RT_FIXTURES_DIR) / GetParam();
        if (!fs::exists(dir_ / "config.json")) GTEST_SKIP() << "no fixture " << dir_;
        auto e = engine::engine::open(dir_.string());
        if (!e && e.status().code() == status_code::NOT_SUPPORTED) GTEST_SKIP() << e.status().to_string();
        ASSERT_TRUE(e.is_ok()) << e.status().to_string();
        eng_ = std::move(e.value());
        if (fs::exists(dir_ / "tokenizer.json")) {
            auto t = text::tokenizer::load((dir_ / "tokenizer.json").string());
            ASSERT_TRUE(t.is_ok()) << t.status().to_string();
            tok_ = std::make_unique<text::tokenizer>(std::move(t.value()));
        }
        auto f = io::safetensors_file::open((dir_ / "expected.safetensors").string());
        ASSERT_TRUE(f.is_ok()) << f.status().to_string();
        prompt_ = ids_of(**f, "prompt.ids");
        gen_ = ids_of(**f, "gen.ids");
        for (int i = 0; i < 3; i++) batch_prompts_.push_back(ids_of(**f, "batch." + std::to_string(i) + ".prompt.ids"));
    }

    // The engine's own greedy continuation, one sequence, one prefill then one token per step.
    std::vector<int32_t> engine_greedy(const std::vector<int32_t> &prompt, int n) {
        const int64_t vocab = eng_->config().vocab_size;
        engine::seq_id s = eng_->create_sequence();
        std::vector<Tensor> logits;
        std::vector<int32_t> out;
        EXPECT_TRUE(eng_->step({{s, prompt}}, &logits).is_ok());
        for (int i = 0; i < n; i++) {
            const Tensor &l = logits[0];
            out.push_back(argmax(l.data<float>() + (l.dim(0) - 1) * vocab, vocab));
            if (i + 1 < n) {
                EXPECT_TRUE(eng_->step({{s, {out.back()}}}, &logits).is_ok());
            }
        }
        eng_->free_sequence(s);
        return out;
    }

    generation_request make(const std::vector<int32_t> &prompt, int max_tokens, collector &c) {
        generation_request r;
        r.prompt = prompt;
        r.max_tokens = max_tokens;
        r.ignore_eos = true;  // random weights: run to max_tokens
        r.on_event = c.callback();
        return r;
    }

    outcome run_alone(generation_request r, scheduler_options opt = {}) {
        scheduler s(*eng_, tok_.get(), opt);
        s.start();
        collector c;
        r.on_event = c.callback();
        auto id = s.submit(std::move(r));
        EXPECT_TRUE(id.is_ok()) << id.status().to_string();
        EXPECT_TRUE(c.wait());
        return *c.out;
    }

    fs::path dir_;
    std::unique_ptr<engine::engine> eng_;
    std::unique_ptr<text::tokenizer> tok_;
    std::vector<int32_t> prompt_, gen_;
    std::vector<std::vector<int32_t>> batch_prompts_;
};

TEST_P(SchedulerFixture, GreedyEqualsEngineGreedy) {
    const int n = int(gen_.size());
    std::vector<int32_t> want = engine_greedy(prompt_, n);
    EXPECT_EQ(want, gen_) << "the engine's greedy continuation differs from the fixture's (engine test territory)";
    collector c;
    outcome o = run_alone(make(prompt_, n, c));
    EXPECT_EQ(o.tokens, want);
    EXPECT_EQ(o.reason, finish_reason::LENGTH);
    EXPECT_EQ(o.completion_tokens, n);
}

TEST_P(SchedulerFixture, ChunkedPrefillUnderSmallBudget) {
    const int n = 8;
    std::vector<int32_t> want = engine_greedy(prompt_, n);
    scheduler_options opt;
    opt.prefill_chunk = 7;
    opt.step_token_budget = 10;
    collector c;
    outcome o = run_alone(make(prompt_, n, c), opt);
    EXPECT_EQ(o.tokens, want);
}

TEST_P(SchedulerFixture, ConcurrentRequestsMatchAlone) {
    std::vector<std::vector<int32_t>> prompts = batch_prompts_;
    prompts.push_back(prompt_);
    const int n = 10;
    auto sampled = [&](const std::vector<int32_t> &p, int i, collector &c) {
        generation_request r = make(p, n, c);
        r.sampling.temperature = 0.9f;
        r.sampling.top_p = 0.95f;
        r.sampling.seed = 1000 + i;
        return r;
    };
    // Alone: greedy, and seeded sampling.
    std::vector<outcome> greedy_alone, sampled_alone;
    for (size_t i = 0; i < prompts.size(); i++) {
        collector c1, c2;
        greedy_alone.push_back(run_alone(make(prompts[i], n, c1)));
        sampled_alone.push_back(run_alone(sampled(prompts[i], int(i), c2)));
    }
    // Together, with a budget that forces prefill chunks to interleave with decode rows.
    scheduler_options opt;
    opt.max_running = 8;
    opt.prefill_chunk = 16;
    opt.step_token_budget = 24;
    scheduler s(*eng_, tok_.get(), opt);
    std::vector<collector> cs(2 * prompts.size());
    for (size_t i = 0; i < prompts.size(); i++) {
        ASSERT_TRUE(s.submit(make(prompts[i], n, cs[2 * i])).is_ok());
        ASSERT_TRUE(s.submit(sampled(prompts[i], int(i), cs[2 * i + 1])).is_ok());
    }
    s.start();
    for (auto &c : cs) ASSERT_TRUE(c.wait());
    for (size_t i = 0; i < prompts.size(); i++) {
        EXPECT_EQ(cs[2 * i].out->tokens, greedy_alone[i].tokens) << "greedy prompt " << i;
        EXPECT_EQ(cs[2 * i + 1].out->tokens, sampled_alone[i].tokens) << "sampled prompt " << i;
    }
    scheduler_metrics m = s.metrics();
    EXPECT_EQ(m.live_sequences, 0);
    EXPECT_EQ(m.requests_finished_length, 2 * prompts.size());
    EXPECT_GT(m.batch_sequences.sum / double(m.batch_sequences.count), 1.5);  // it did batch
}

TEST_P(SchedulerFixture, SeedReproducesSampling) {
    auto run = [&](int64_t seed) {
        collector c;
        generation_request r = make(prompt_, 12, c);
        r.sampling.temperature = 1.0f;
        r.sampling.seed = seed;
        return run_alone(std::move(r)).tokens;
    };
    auto a = run(7), b = run(7), c = run(8);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
}

TEST_P(SchedulerFixture, CancelFreesTheSequence) {
    scheduler_options opt;
    opt.max_running = 1;
    scheduler s(*eng_, tok_.get(), opt);
    collector running, queued;
    auto *sched = &s;
    std::atomic<request_id> rid{0};
    generation_request r = make(prompt_, 1, running);
    r.max_tokens = int32_t(std::min<int64_t>(100000, s.max_context() - int64_t(prompt_.size())));
    auto inner = r.on_event;
    r.on_event = [inner, sched, &rid](const generation_event &ev) {
        inner(ev);
        if (ev.completion_tokens == 3 && !ev.finished) sched->cancel(rid.load());  // from the callback
    };
    auto id = s.submit(std::move(r));
    ASSERT_TRUE(id.is_ok());
    rid = *id;
    auto q = s.submit(make(prompt_, 4, queued));  // waits behind the first (max_running 1)
    ASSERT_TRUE(q.is_ok());
    s.cancel(*q);
    s.start();
    ASSERT_TRUE(running.wait());
    ASSERT_TRUE(queued.wait());
    EXPECT_EQ(running.out->reason, finish_reason::CANCELLED);
    EXPECT_EQ(running.out->tokens.size(), 3u);  // cancelled before the next step
    EXPECT_EQ(queued.out->reason, finish_reason::CANCELLED);
    EXPECT_TRUE(queued.out->tokens.empty());
    scheduler_metrics m = s.metrics();
    EXPECT_EQ(m.live_sequences, 0);
    EXPECT_EQ(m.requests_cancelled, 2u);
    // The scheduler keeps serving.
    collector after;
    ASSERT_TRUE(s.submit(make(prompt_, 2, after)).is_ok());
    ASSERT_TRUE(after.wait());
    EXPECT_EQ(after.out->reason, finish_reason::LENGTH);
}

TEST_P(SchedulerFixture, QueueFullAndContextLimits) {
    scheduler_options opt;
    opt.max_queue = 2;
    const int64_t ctx = int64_t(prompt_.size()) + 8;
    opt.max_context = ctx;
    scheduler s(*eng_, tok_.get(), opt);  // not started: the queue fills
    collector a, b, c, d;
    EXPECT_TRUE(s.submit(make(prompt_, 2, a)).is_ok());
    EXPECT_TRUE(s.submit(make(prompt_, 2, b)).is_ok());
    auto full = s.submit(make(prompt_, 2, c));
    EXPECT_EQ(full.status().code(), status_code::RESOURCE_EXHAUSTED);
    auto too_long = s.submit(make(prompt_, 9, d));
    EXPECT_EQ(too_long.status().code(), status_code::EXCEEDS_CONTEXT);
    std::vector<int32_t> bad = prompt_;
    bad[0] = int32_t(eng_->config().vocab_size);
    EXPECT_EQ(s.submit(make(bad, 2, d)).status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(s.submit(make({}, 2, d)).status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(s.metrics().requests_rejected, 1u);
    EXPECT_EQ(s.metrics().queue_depth, 2);
    s.start();
    ASSERT_TRUE(a.wait());
    ASSERT_TRUE(b.wait());
    EXPECT_EQ(a.out->reason, finish_reason::LENGTH);
    // Exactly at the context: allowed, ends with length.
    collector e;
    ASSERT_TRUE(s.submit(make(prompt_, 8, e)).is_ok());
    ASSERT_TRUE(e.wait());
    EXPECT_EQ(e.out->completion_tokens, 8);
    EXPECT_EQ(e.out->reason, finish_reason::LENGTH);
}

TEST_P(SchedulerFixture, StopStringEndsAndIsWithheld) {
    if (!tok_) GTEST_SKIP() << "fixture has no tokenizer.json";
    collector c;
    outcome full = run_alone(make(prompt_, 16, c));
    // A two-byte ASCII stop string that occurs in the output after its first few bytes.
    std::string stop;
    for (size_t i = 2; i + 1 < full.text.size(); i++) {
        unsigned char x = full.text[i], y = full.text[i + 1];
        if (x > 0x20 && x < 0x7f && y > 0x20 && y < 0x7f) {
            stop = full.text.substr(i, 2);
            break;
        }
    }
    if (stop.empty()) GTEST_SKIP() << "no ASCII pair in the output";
    collector c2;
    generation_request r = make(prompt_, 16, c2);
    r.stop = {stop};
    outcome o = run_alone(std::move(r));
    EXPECT_EQ(o.reason, finish_reason::STOP);
    EXPECT_EQ(o.text, full.text.substr(0, full.text.find(stop)));
    ASSERT_LE(o.tokens.size(), full.tokens.size());
    EXPECT_EQ(o.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + int64_t(o.tokens.size())));
}

TEST_P(SchedulerFixture, StopTokenEndsWithoutText) {
    // The first greedy token as a stop token: the request ends with STOP after it, no text.
    std::vector<int32_t> want = engine_greedy(prompt_, 1);
    collector c;
    generation_request r = make(prompt_, 5, c);
    r.stop_token_ids = {want[0]};
    outcome o = run_alone(std::move(r));
    EXPECT_EQ(o.reason, finish_reason::STOP);
    EXPECT_EQ(o.tokens, want);
    EXPECT_EQ(o.text, "");
}

TEST_P(SchedulerFixture, GrammarConstrainsAndTerminates) {
    // A JSON-schema grammar: whatever the random model prefers, the output is one of the two
    // sentences, and accepting EOS ends the request (STOP) even under ignore_eos.
    if (!tok_) GTEST_SKIP() << "fixture without tokenizer.json";
    const int32_t eos = int32_t(eng_->config().eos_token_id);
    auto compiler = text::grammar_compiler::create(*tok_, int32_t(eng_->config().vocab_size), {eos});
    ASSERT_TRUE(compiler.is_ok()) << compiler.status().to_string();
    auto g = (*compiler)->json_schema(R"({"type": "string", "enum": ["yes", "no"]})", true);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    for (bool ignore_eos : {true, false})
        for (bool sampled : {false, true}) {
            collector c;
            generation_request r = make(prompt_, 32, c);
            r.ignore_eos = ignore_eos;
            r.grammar = *g;
            if (sampled) {
                r.sampling.temperature = 1.0f;
                r.sampling.seed = 5;
            }
            outcome o = run_alone(std::move(r));
            EXPECT_EQ(o.reason, finish_reason::STOP) << "ignore_eos " << ignore_eos << " sampled " << sampled;
            EXPECT_TRUE(o.text == "\"yes\"" || o.text == "\"no\"") << o.text;
            ASSERT_FALSE(o.tokens.empty());
            EXPECT_EQ(o.tokens.back(), eos);
        }
}

INSTANTIATE_TEST_SUITE_P(fixtures, SchedulerFixture,
                         ::testing::Values("deepseek-v41-flash-quant", "deepseek-v4-flash-quant"),
                         [](const auto &info) {
                             std::string n = info.param;
                             for (char &ch : n)
                                 if (!isalnum((unsigned char)ch)) ch = '_';
                             return n;
                         });

}  // namespace
