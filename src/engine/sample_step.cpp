// The engine's sampling of SAMPLE rows on the host: sample_on_host, step_sampled for engines
// without a device sampler (the GPU engines override it, and fall back to this per step), and the
// issued steps' base (issue_sampled / collect_sampled: each step run whole when issued).
#include <string>

#include "engine/engine.h"

namespace ds41rt::engine {

sample_result sample_on_host(std::span<const float> row, const sample_spec &spec) {
    std::vector<float> work;
    std::vector<int32_t> order;
    sample_result r;
    r.token = backend::cpu::sample_row(row, spec.p, spec.counts, spec.allowed,
                                       backend::cpu::sampling_uniform(spec.seed, spec.position), work, order);
    if (spec.logprobs) r.logprob = backend::cpu::raw_logprob(row, r.token, spec.top_logprobs, &r.top);
    return r;
}

Status engine::step_sampled(const std::vector<step_input> &inputs, std::vector<Tensor> *logits,
                            std::vector<sample_result> *sampled) {
    DS41RT_RETURN_IF_ERROR(step(inputs, logits));
    if (logits->size() != inputs.size())
        return Status::internal("engine step returned " + std::to_string(logits->size()) + " results for " +
                                std::to_string(inputs.size()) + " inputs");
    sampled->assign(inputs.size(), sample_result{});
    for (size_t i = 0; i < inputs.size(); i++) {
        if (inputs[i].logits != logit_rows::SAMPLE) continue;
        const Tensor &l = (*logits)[i];
        const int64_t vocab = l.dim(1);
        (*sampled)[i] = sample_on_host({l.f() + (l.dim(0) - 1) * vocab, size_t(vocab)}, inputs[i].sample);
        (*logits)[i] = Tensor::f32({0, vocab});
    }
    return Status::ok();
}

Status engine::issue_sampled(const std::vector<step_input> &inputs) {
    std::vector<step_input> in = inputs;
    for (step_input &i : in)
        for (int32_t &t : i.tokens) {
            if (t != PREVIOUS_PICK) continue;
            auto it = last_pick_.find(i.seq);
            if (it == last_pick_.end())
                return Status::invalid_argument("sequence " + std::to_string(i.seq) +
                                                ": a PREVIOUS_PICK token, but no issued step sampled it");
            t = it->second;
        }
    std::vector<Tensor> logits;
    std::vector<sample_result> picks;
    DS41RT_RETURN_IF_ERROR(step_sampled(in, &logits, &picks));
    for (size_t i = 0; i < in.size(); i++)
        if (in[i].logits == logit_rows::SAMPLE) last_pick_[in[i].seq] = picks[i].token;
    issued_.push_back(std::move(picks));
    return Status::ok();
}

Status engine::collect_sampled(std::vector<sample_result> *sampled) {
    if (issued_.empty()) return Status::invalid_argument("collect_sampled: no issued step to collect");
    *sampled = std::move(issued_.front());
    issued_.pop_front();
    return Status::ok();
}

}  // namespace ds41rt::engine
