// What the CPU-reference forward passes (v4_model, v41_model) share as engines: the table of
// live sequences, step()'s input checks and its loop over sequences. A model supplies the state
// type (it must have `int64_t len`), how a fresh state looks, and the forward of one sequence's
// new tokens. Sequences are run one after another: the reference has no cross-sequence batching
// (engine/cuda/gpu_engine overrides step() to run them as one batch, with check_inputs() and
// state_of()).
#pragma once

#include <map>
#include <string>

#include "engine/engine.h"

namespace ds41rt::engine {

template <typename State>
class cpu_engine : public engine {
public:
    seq_id create_sequence() override {
        const seq_id id = next_id_++;
        seqs_[id] = new_state();
        return id;
    }
    void free_sequence(seq_id s) override {
        seqs_.erase(s);
        this->forget_pick(s);
    }
    int64_t sequence_length(seq_id s) const override {
        auto it = seqs_.find(s);
        return it == seqs_.end() ? -1 : it->second.len;
    }

    Status step(const std::vector<step_input> &inputs, std::vector<Tensor> *logits) override {
        logits->clear();
        DS41RT_RETURN_IF_ERROR(check_inputs(inputs));
        const int64_t vocab = config().vocab_size;
        for (const auto &in : inputs) {
            const int64_t keep = logits_rows_of(in);
            Tensor out = Tensor::f32({keep, vocab});
            DS41RT_RETURN_IF_ERROR(forward(seqs_[in.seq], in.tokens, keep, out.f()));
            logits->push_back(std::move(out));
        }
        return Status::ok();
    }

protected:
    // step()'s input checks, made before any state changes.
    Status check_inputs(const std::vector<step_input> &inputs) const {
        const int64_t vocab = config().vocab_size;
        for (const auto &in : inputs) {
            if (!seqs_.count(in.seq)) return Status::invalid_argument("unknown sequence " + std::to_string(in.seq));
            if (in.tokens.empty()) return Status::invalid_argument("step with no tokens");
            for (int32_t t : in.tokens)
                if (t < 0 || t >= vocab)
                    return Status::invalid_argument("token id " + std::to_string(t) + " outside the vocabulary");
        }
        return Status::ok();
    }
    // The state of a sequence check_inputs() accepted.
    State &state_of(seq_id s) { return seqs_.at(s); }

    // Drops every sequence now (a derived engine whose states hold resources it owns, such as
    // device memory on its stream, calls this in its destructor, before those resources go).
    void clear_sequences() { seqs_.clear(); }

    virtual State new_state() const = 0;
    // Runs tokens at positions state.len.. and writes the logits of the last `keep` of them
    // [keep, vocab] (the head runs over those rows only); advances len. On failure (a remote
    // expert layer) the state is part-way through: the caller frees it.
    virtual Status forward(State &state, const std::vector<int32_t> &tokens, int64_t keep, float *logits) const = 0;

private:
    std::map<seq_id, State> seqs_;
    seq_id next_id_ = 0;
};

}  // namespace ds41rt::engine
