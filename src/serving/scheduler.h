// The scheduler: one thread that owns the engine and runs every admitted request through it in
// continuous batches.
//
// Each loop iteration (one engine step):
//  1. cancellations are applied: a cancelled request's sequence is freed before the next step and
//     it gets its final event (CANCELLED); a queued one is dropped the same way;
//  2. queued requests are admitted in arrival order while fewer than max_running hold a sequence;
//  3. one step() is built under a token budget: first one decode row for every running request
//     that has a token to feed, then prefill chunks (at most prefill_chunk tokens of one prompt,
//     oldest request first) until the budget is spent. Decode goes first so a long prompt
//     arriving does not stall the streams already running (inter-token latency);
//  4. every request whose row completed its prompt, or decoded, gets its next token, sampled by
//     the engine (engine::step_sampled, on the device for the GPU engines) as its sampler and
//     grammar mask say (serving/sampling.h; the grammar then accepts the token), and an event; a request that stops (EOS, stop string, max_tokens, a
//     terminated grammar) frees its sequence at once.
//
// Admission: submit() checks the request (INVALID_ARGUMENT; EXCEEDS_CONTEXT when prompt +
// max_tokens does not fit the context) and queues it; when max_queue requests are already
// waiting it returns RESOURCE_EXHAUSTED (the server answers 429 with Retry-After).
//
// Determinism: the engine computes each row independently of the rest of the batch, and the
// sampler's draw depends only on (seed, output position); so a request's output does not depend
// on what else is running, or on how its prompt was chunked, beyond the engine's own chunking
// tolerance (tests/unit/scheduler_test.cpp checks equality on the fixtures).
//
// Threading: submit(), cancel(), metrics() and max_context() may be called from any thread.
// start() and stop() from the owning thread only. The engine and tokenizer are used only by the
// scheduler thread once start() was called, and must outlive the scheduler.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "serving/metrics.h"
#include "serving/request.h"
#include "serving/sampling.h"
#include "serving/stop_text.h"
#include "text/tokenizer.h"

namespace ds41rt::serving {

struct scheduler_options {
    int32_t max_queue = 64;           // requests waiting for admission; more are rejected
    int32_t max_running = 8;          // requests holding an engine sequence at once
    int32_t step_token_budget = 512;  // tokens in one engine step (decode rows + prefill chunks)
    int32_t prefill_chunk = 512;      // most prompt tokens of one request in one step (cmd_serve.cpp: why)
    int64_t max_context = 0;          // 0: the model's max_position_embeddings
};

using request_id = uint64_t;

class scheduler {
public:
    // tok may be null: no output text then, and stop strings are rejected.
    scheduler(engine::engine &eng, const text::tokenizer *tok, scheduler_options opt = {});
    ~scheduler();  // stop()

    scheduler(const scheduler &) = delete;
    scheduler &operator=(const scheduler &) = delete;

    // ---- owning thread only ----
    void start();
    // Cancels every queued and running request (each gets its CANCELLED event), frees their
    // sequences and joins the thread. Later submits are UNAVAILABLE.
    void stop();

    // ---- any thread ----
    Result<request_id> submit(generation_request r);
    // Asynchronous: the request ends with CANCELLED before the next engine step starts (its
    // sequence is freed then). Unknown or finished ids are ignored.
    void cancel(request_id id);
    scheduler_metrics metrics() const;
    int64_t max_context() const { return max_context_; }
    int32_t eos_token() const { return eos_; }
    const scheduler_options &options() const { return opt_; }

private:
    using clock = std::chrono::steady_clock;

    struct active {
        request_id id = 0;
        generation_request req;
        std::unique_ptr<sampler_state> sampler;
        std::unique_ptr<stop_text> text;
        std::unique_ptr<text::grammar_matcher> grammar;  // when req.grammar
        std::vector<uint32_t> mask;                      // its token bitmask, refilled each step
        engine::seq_id seq = -1;
        size_t prefilled = 0;         // prompt tokens already stepped
        int64_t generated = 0;
        int32_t pending = -1;         // sampled, not yet fed to the engine
        clock::time_point submitted, last_token;
    };

    void loop();
    void finish(active &a, generation_event ev);  // final event, frees the sequence
    void emit(active &a, generation_event &ev);
    static engine::sample_spec sample_spec_of(active &a);
    void process_row(active &a, const engine::sample_result &pick);

    engine::engine &eng_;
    const text::tokenizer *tok_;
    scheduler_options opt_;
    int64_t max_context_ = 0;
    int64_t vocab_ = 0;
    int32_t eos_ = -1;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<active>> queue_;   // guarded by mu_
    std::unordered_set<request_id> cancels_;      // guarded by mu_
    bool stopping_ = false;                       // guarded by mu_
    bool started_ = false;                        // guarded by mu_
    request_id next_id_ = 1;                      // guarded by mu_
    std::mt19937_64 seed_rng_;                    // guarded by mu_ (seeds of unseeded requests)
    scheduler_metrics metrics_;                   // guarded by mu_

    std::vector<std::unique_ptr<active>> running_;  // scheduler thread only
    std::thread thread_;
};

}  // namespace ds41rt::serving
