// The scheduler loop: admission, step building under a token budget, sampling, stop rules,
// cancellation (see scheduler.h for the contract).
#include "serving/scheduler.h"

#include <algorithm>
#include <string>

namespace ds41rt::serving {

scheduler::scheduler(engine::engine &eng, const text::tokenizer *tok, scheduler_options opt)
    : eng_(eng), tok_(tok), opt_(opt), seed_rng_(std::random_device{}()) {
    const auto &cfg = eng_.config();
    vocab_ = cfg.vocab_size;
    eos_ = cfg.eos_token_id;
    max_context_ = opt_.max_context > 0 ? opt_.max_context : cfg.max_position_embeddings;
    opt_.max_queue = std::max(opt_.max_queue, 0);
    opt_.max_running = std::max(opt_.max_running, 1);
    opt_.prefill_chunk = std::max(opt_.prefill_chunk, 1);
    // Every running request must be able to decode in every step.
    opt_.step_token_budget = std::max(opt_.step_token_budget, opt_.max_running);
}

scheduler::~scheduler() { stop(); }

void scheduler::start() {
    std::lock_guard<std::mutex> lk(mu_);
    if (started_ || stopping_) return;
    started_ = true;
    thread_ = std::thread([this] { loop(); });
}

void scheduler::stop() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    // Never started, or the loop has exited: cancel whatever is left on this thread.
    std::deque<std::unique_ptr<active>> left;
    {
        std::lock_guard<std::mutex> lk(mu_);
        left.swap(queue_);
        metrics_.queue_depth = 0;
    }
    for (auto &a : left) {
        generation_event ev;
        ev.reason = finish_reason::CANCELLED;
        finish(*a, std::move(ev));
    }
    for (auto &a : running_) {
        generation_event ev;
        ev.reason = finish_reason::CANCELLED;
        finish(*a, std::move(ev));
    }
    running_.clear();
}

Result<request_id> scheduler::submit(generation_request r) {
    if (r.prompt.empty()) return Status::invalid_argument("prompt: empty");
    for (size_t i = 0; i < r.prompt.size(); i++)
        if (r.prompt[i] < 0 || r.prompt[i] >= vocab_)
            return Status::invalid_argument("prompt[" + std::to_string(i) + "]: token id " +
                                            std::to_string(r.prompt[i]) + " outside the vocabulary [0, " +
                                            std::to_string(vocab_) + ")");
    if (r.max_tokens < 1) return Status::invalid_argument("max_tokens: must be at least 1");
    if (int64_t(r.prompt.size()) + r.max_tokens > max_context_)
        return Status(status_code::EXCEEDS_CONTEXT,
                      "this model's context is " + std::to_string(max_context_) + " tokens; the prompt has " +
                          std::to_string(r.prompt.size()) + " and max_tokens asks for " +
                          std::to_string(r.max_tokens) + " more");
    DS41RT_RETURN_IF_ERROR(validate_sampling_params(r.sampling));
    std::unique_ptr<text::grammar_matcher> matcher;
    if (r.grammar) {
        matcher = std::make_unique<text::grammar_matcher>(r.grammar);
        if (matcher->vocab_size() != vocab_)
            return Status::invalid_argument("grammar: compiled for a vocabulary of " + std::to_string(matcher->vocab_size()) +
                                            " ids; the model has " + std::to_string(vocab_));
    }
    if (!tok_ && std::any_of(r.stop.begin(), r.stop.end(), [](const std::string &s) { return !s.empty(); }))
        return Status::not_supported("stop: stop strings need a tokenizer");

    auto a = std::make_unique<active>();
    a->submitted = clock::now();
    std::unique_lock<std::mutex> lk(mu_);
    if (stopping_) return Status::unavailable("the scheduler is shutting down");
    if (int64_t(queue_.size()) >= opt_.max_queue) {
        metrics_.requests_rejected++;
        return Status::resource_exhausted("the request queue is full (" + std::to_string(opt_.max_queue) +
                                   " waiting); retry later");
    }
    const uint64_t seed = r.sampling.seed ? uint64_t(*r.sampling.seed) : seed_rng_();
    a->id = next_id_++;
    a->sampler = std::make_unique<sampler_state>(r.sampling, seed);
    a->text = std::make_unique<stop_text>(r.stop);
    if (matcher) {
        a->mask.resize(size_t(text::grammar_mask_words(int32_t(vocab_))));
        a->grammar = std::move(matcher);
    }
    a->req = std::move(r);
    const request_id id = a->id;
    queue_.push_back(std::move(a));
    metrics_.requests_submitted++;
    metrics_.queue_depth = int64_t(queue_.size());
    lk.unlock();
    cv_.notify_all();
    return id;
}

void scheduler::cancel(request_id id) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        cancels_.insert(id);
    }
    cv_.notify_all();
}

scheduler_metrics scheduler::metrics() const {
    std::lock_guard<std::mutex> lk(mu_);
    return metrics_;
}

void scheduler::emit(active &a, generation_event &ev) {
    ev.prompt_tokens = int64_t(a.req.prompt.size());
    ev.completion_tokens = a.generated;
    if (a.req.on_event) a.req.on_event(ev);
}

void scheduler::finish(active &a, generation_event ev) {
    ev.finished = true;
    if (a.seq >= 0) {
        eng_.free_sequence(a.seq);
        a.seq = -1;
        std::lock_guard<std::mutex> lk(mu_);
        metrics_.live_sequences--;
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        switch (ev.reason) {
        case finish_reason::STOP: metrics_.requests_finished_stop++; break;
        case finish_reason::LENGTH: metrics_.requests_finished_length++; break;
        case finish_reason::CANCELLED: metrics_.requests_cancelled++; break;
        default: metrics_.requests_failed++; break;
        }
    }
    emit(a, ev);
}

// What the engine samples for a request whose row ends its prompt or decodes: its sampler's
// spec under its grammar's mask (the grammar state is the one the pick will continue).
engine::sample_spec scheduler::sample_spec_of(active &a) {
    std::span<const uint32_t> allowed;
    if (a.grammar) {
        a.grammar->fill_mask(a.mask);
        allowed = a.mask;
    }
    return a.sampler->spec(a.generated, allowed);
}

// The engine's pick for a request whose prompt is complete: apply the stop rules, emit. The
// caller removes the request from running_ when it finished.
void scheduler::process_row(active &a, const engine::sample_result &pick) {
    generation_event ev;
    const int32_t tok = pick.token;
    if (a.req.sampling.logprobs) ev.logprobs = to_token_logprobs(pick);
    if (a.grammar && !a.grammar->accept(tok)) {
        // Only when the grammar allows nothing at all (the sampler fell back to an unmasked id).
        ev.reason = finish_reason::ERROR;
        ev.error = Status::internal("grammar: no token can continue the constrained output");
        finish(a, std::move(ev));
        return;
    }
    a.sampler->accept(tok);
    a.generated++;
    ev.token = tok;

    const auto now = clock::now();
    {
        std::lock_guard<std::mutex> lk(mu_);
        metrics_.generation_tokens++;
        const auto since = a.generated == 1 ? now - a.submitted : now - a.last_token;
        (a.generated == 1 ? metrics_.time_to_first_token : metrics_.inter_token_latency)
            .observe(std::chrono::duration<double>(since).count());
    }
    a.last_token = now;

    const bool is_eos = (!a.req.ignore_eos && tok == eos_) ||
                        std::find(a.req.stop_token_ids.begin(), a.req.stop_token_ids.end(), tok) !=
                            a.req.stop_token_ids.end();
    if (is_eos) {
        ev.text = a.text->finish();
        ev.reason = finish_reason::STOP;
    } else {
        if (tok_ && !(a.req.skip_special_tokens && tok_->is_special(tok))) ev.text = a.text->push(tok_->token_bytes(tok));
        if (a.text->stopped()) {
            ev.reason = finish_reason::STOP;
        } else if (a.grammar && a.grammar->terminated()) {
            // A stop token the grammar required, kept as text because of ignore_eos.
            ev.text += a.text->finish();
            ev.reason = finish_reason::STOP;
        } else if (a.generated >= a.req.max_tokens ||
                   int64_t(a.req.prompt.size()) + a.generated >= max_context_) {
            ev.text += a.text->finish();
            ev.reason = finish_reason::LENGTH;
        }
    }
    if (ev.reason != finish_reason::NONE) {
        finish(a, std::move(ev));
    } else {
        a.pending = tok;
        emit(a, ev);
    }
}

void scheduler::loop() {
    for (;;) {
        std::vector<std::unique_ptr<active>> dropped;  // cancelled while queued
        std::vector<std::unique_ptr<active>> admitted;
        std::unordered_set<request_id> cancels;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !running_.empty() || !cancels_.empty(); });
            if (stopping_) return;  // stop() cancels what is left
            cancels.swap(cancels_);
            for (auto it = queue_.begin(); it != queue_.end();) {
                if (cancels.count((*it)->id)) {
                    dropped.push_back(std::move(*it));
                    it = queue_.erase(it);
                } else {
                    ++it;
                }
            }
            while (!queue_.empty() && int64_t(running_.size() + admitted.size()) < opt_.max_running) {
                admitted.push_back(std::move(queue_.front()));
                queue_.pop_front();
            }
            metrics_.queue_depth = int64_t(queue_.size());
        }
        for (auto &a : dropped) {
            generation_event ev;
            ev.reason = finish_reason::CANCELLED;
            finish(*a, std::move(ev));
        }
        // Cancelled running requests: freed now, before the next step.
        for (auto it = running_.begin(); it != running_.end();) {
            if (cancels.count((*it)->id)) {
                generation_event ev;
                ev.reason = finish_reason::CANCELLED;
                finish(**it, std::move(ev));
                it = running_.erase(it);
            } else {
                ++it;
            }
        }
        for (auto &a : admitted) {
            a->seq = eng_.create_sequence();
            {
                std::lock_guard<std::mutex> lk(mu_);
                metrics_.live_sequences++;
            }
            running_.push_back(std::move(a));
        }
        {
            std::lock_guard<std::mutex> lk(mu_);
            metrics_.running = int64_t(running_.size());
        }
        if (running_.empty()) continue;

        // Build the step: decode rows first, then prefill chunks, oldest first.
        std::vector<engine::step_input> inputs;
        std::vector<active *> rows;
        std::vector<size_t> chunk;  // prompt tokens in the row (0: decode)
        int64_t budget = opt_.step_token_budget;
        for (auto &a : running_)
            if (a->prefilled == a->req.prompt.size() && a->pending >= 0) {
                inputs.push_back({a->seq, {a->pending}, engine::logit_rows::SAMPLE, sample_spec_of(*a)});
                rows.push_back(a.get());
                chunk.push_back(0);
                budget--;
            }
        for (auto &a : running_) {
            if (budget <= 0) break;
            const size_t left = a->req.prompt.size() - a->prefilled;
            if (left == 0) continue;
            const size_t n = std::min<size_t>({left, size_t(opt_.prefill_chunk), size_t(budget)});
            engine::step_input in{a->seq, {}};
            in.tokens.assign(a->req.prompt.begin() + int64_t(a->prefilled),
                             a->req.prompt.begin() + int64_t(a->prefilled + n));
            // The prompt's last row is sampled; earlier chunks need no logits at all.
            if (a->prefilled + n == a->req.prompt.size()) {
                in.logits = engine::logit_rows::SAMPLE;
                in.sample = sample_spec_of(*a);
            } else {
                in.logits = engine::logit_rows::NONE;
            }
            inputs.push_back(std::move(in));
            rows.push_back(a.get());
            chunk.push_back(n);
            budget -= int64_t(n);
        }
        if (inputs.empty()) continue;

        std::vector<Tensor> logits;
        std::vector<engine::sample_result> picks;
        Status st = eng_.step_sampled(inputs, &logits, &picks);
        {
            std::lock_guard<std::mutex> lk(mu_);
            metrics_.engine_steps++;
            metrics_.batch_sequences.observe(double(inputs.size()));
            metrics_.batch_tokens.observe(double(opt_.step_token_budget - budget));
        }
        if (!st.is_ok() || picks.size() != inputs.size()) {
            if (st.is_ok()) st = Status::internal("engine step returned " + std::to_string(picks.size()) +
                                                  " picks for " + std::to_string(inputs.size()) + " inputs");
            for (active *a : rows) {
                generation_event ev;
                ev.reason = finish_reason::ERROR;
                ev.error = st;
                finish(*a, std::move(ev));
            }
        } else {
            for (size_t i = 0; i < rows.size(); i++) {
                active &a = *rows[i];
                if (chunk[i] > 0) {
                    a.prefilled += chunk[i];
                    {
                        std::lock_guard<std::mutex> lk(mu_);
                        metrics_.prompt_tokens += chunk[i];
                    }
                    if (a.prefilled < a.req.prompt.size()) continue;
                }
                a.pending = -1;
                process_row(a, picks[i]);
            }
        }
        // Drop the finished (their sequences are already freed).
        std::erase_if(running_, [](const std::unique_ptr<active> &a) { return a->seq < 0; });
        {
            std::lock_guard<std::mutex> lk(mu_);
            metrics_.running = int64_t(running_.size());
        }
    }
}

}  // namespace ds41rt::serving
