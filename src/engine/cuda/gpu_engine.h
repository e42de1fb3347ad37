// What the GPU forward passes (v41_gpu, v4_gpu) share as engines: step() and step_sampled() run
// every input's tokens as one batch of rows (step_rows.h batched_step; SAMPLE rows picked on the
// device where device_sampling allows), and cpu_engine's one-sequence forward, all over the
// pass's forward_rows.
#pragma once

#include <vector>

#include "engine/cpu_engine.h"
#include "engine/cuda/device_model.h"
#include "engine/cuda/device_sampling.h"
#include "engine/cuda/step_rows.h"

namespace ds41rt::engine::gpu {

template <class Seq>
class gpu_engine : public cpu_engine<Seq> {
public:
    Status step(const std::vector<step_input> &inputs, std::vector<Tensor> *logits) override {
        return run_step(inputs, logits, nullptr);
    }
    Status step_sampled(const std::vector<step_input> &inputs, std::vector<Tensor> *logits,
                        std::vector<sample_result> *sampled) override {
        return run_step(inputs, logits, sampled);
    }

protected:
    // Every row of B through the model: logits [B.logits_rows(), vocab] to the host, or, when
    // B.samples is set, the picks into B.sampled (engine/cuda/device_sampling).
    virtual Status forward_rows(step_rows<Seq> &B, const std::vector<int32_t> &tokens, float *logits) const = 0;
    virtual const device_model &gpu_model() const = 0;

private:
    Status run_step(const std::vector<step_input> &inputs, std::vector<Tensor> *logits,
                    std::vector<sample_result> *sampled) {
        logits->clear();
        DS41RT_RETURN_IF_ERROR(this->check_inputs(inputs));
        return batched_step<Seq>(
            inputs, this->config().vocab_size, [&](seq_id s) -> Seq & { return this->state_of(s); },
            [&](step_rows<Seq> &B, const std::vector<int32_t> &t, float *l) { return forward_rows(B, t, l); }, logits,
            sampled, device_samples(gpu_model()));
    }

    // One sequence alone (cpu_engine's interface; step() batches instead).
    Status forward(Seq &sq, const std::vector<int32_t> &tokens, int64_t keep, float *logits) const override {
        step_rows<Seq> B = single_rows(sq, int64_t(tokens.size()), keep);
        return forward_rows(B, tokens, logits);
    }
};

}  // namespace ds41rt::engine::gpu
