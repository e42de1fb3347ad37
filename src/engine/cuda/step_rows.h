// The rows of one GPU step, shared by the V4.1 and V4 forward passes: the new tokens of several
// sequences concatenated. Row-wise ops run over all rows at once; the steps that read or write a
// sequence's own state walk the sequences, each over its rows [off, off + n).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/engine.h"

namespace ds41rt::engine::gpu {

template <class Seq>
struct step_rows {
    std::vector<Seq *> seq;
    std::vector<int64_t> off, n, p0;  // per sequence
    int64_t rows = 0;
    const int64_t *pos_d = nullptr;  // [rows] device positions
    // The rows whose logits the step returns, in order; all_logits: every row (out_rows unused).
    bool all_logits = true;
    std::vector<int32_t> out_rows;
    int64_t logits_rows() const { return all_logits ? rows : int64_t(out_rows.size()); }
    // When every returned row is a SAMPLE row and the device samples (batched_step decides):
    // their specs in row order; the forward then samples on the device into `sampled` and
    // returns no logits.
    std::vector<const sample_spec *> samples;
    std::vector<sample_result> sampled;

    // Each row's position in its sequence.
    std::vector<int64_t> positions() const {
        std::vector<int64_t> pos(static_cast<size_t>(rows));
        for (size_t i = 0; i < seq.size(); i++)
            for (int64_t s = 0; s < n[i]; s++) pos[size_t(off[i] + s)] = p0[i] + s;
        return pos;
    }
};

// n new tokens of one sequence, the logits of the last `keep` returned (cpu_engine's
// one-sequence forward).
template <class Seq>
step_rows<Seq> single_rows(Seq &sq, int64_t n, int64_t keep) {
    step_rows<Seq> B;
    B.seq = {&sq};
    B.off = {0};
    B.n = {n};
    B.p0 = {sq.len};
    B.rows = n;
    B.all_logits = keep == n;
    for (int64_t r = n - keep; r < n; r++) B.out_rows.push_back(int32_t(r));
    return B;
}

// engine::step / step_sampled for the GPU passes: every input's tokens as one set of rows through
// forward_rows(rows, tokens, logits [rows.logits_rows(), vocab]), the logits split back per input
// (each input's logit_rows: all its rows, its last, or none). With `sampled` (step_sampled), the
// SAMPLE inputs' picks: from the device sampler when every returned row is a SAMPLE row and
// device_sampler holds (forward_rows fills rows.sampled then and returns no logits), else from
// the rows on the host (sample_on_host: the same picks).
// state_of(seq_id) -> Seq&; a sequence may appear once.
template <class Seq, class StateOf, class Forward>
Status batched_step(const std::vector<step_input> &inputs, int64_t vocab, StateOf &&state_of, Forward &&forward_rows,
                    std::vector<Tensor> *logits, std::vector<sample_result> *sampled = nullptr,
                    bool device_sampler = false) {
    step_rows<Seq> B;
    std::vector<int32_t> tokens;
    for (const auto &in : inputs) {
        Seq *sq = &state_of(in.seq);
        if (std::find(B.seq.begin(), B.seq.end(), sq) != B.seq.end())
            return Status::invalid_argument("sequence " + std::to_string(in.seq) + " appears twice in one step");
        B.seq.push_back(sq);
        B.off.push_back(B.rows);
        B.n.push_back(int64_t(in.tokens.size()));
        B.p0.push_back(sq->len);
        B.rows += int64_t(in.tokens.size());
        tokens.insert(tokens.end(), in.tokens.begin(), in.tokens.end());
    }
    std::vector<int64_t> first_out;  // each input's first row in the returned logits
    bool all_sampled = sampled != nullptr && device_sampler;
    for (size_t i = 0; i < inputs.size(); i++) {
        const int64_t keep = logits_rows_of(inputs[i]);
        B.all_logits = B.all_logits && keep == B.n[i];
        first_out.push_back(int64_t(B.out_rows.size()));
        for (int64_t r = B.n[i] - keep; r < B.n[i]; r++) B.out_rows.push_back(int32_t(B.off[i] + r));
        if (keep > 0) all_sampled = all_sampled && inputs[i].logits == logit_rows::SAMPLE;
        if (inputs[i].logits == logit_rows::SAMPLE && keep > 0) B.samples.push_back(&inputs[i].sample);
    }
    if (!all_sampled) B.samples.clear();
    Tensor all = Tensor::f32({B.samples.empty() ? B.logits_rows() : 0, vocab});
    DS41RT_RETURN_IF_ERROR(forward_rows(B, tokens, all.f()));
    if (sampled) sampled->assign(inputs.size(), sample_result{});
    for (size_t i = 0; i < inputs.size(); i++) {
        const bool sample = sampled && inputs[i].logits == logit_rows::SAMPLE;
        if (sample && !B.samples.empty()) {
            (*sampled)[i] = std::move(B.sampled[size_t(first_out[i])]);
        } else if (sample) {
            (*sampled)[i] = sample_on_host({all.f() + first_out[i] * vocab, size_t(vocab)}, inputs[i].sample);
        }
        const int64_t keep = sample ? 0 : logits_rows_of(inputs[i]);
        Tensor out = Tensor::f32({keep, vocab});
        if (keep > 0) std::copy(all.f() + first_out[i] * vocab, all.f() + (first_out[i] + keep) * vocab, out.f());
        logits->push_back(std::move(out));
    }
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
