// The end of a GPU step: the head's logits rows to the host, or, when every row is a SAMPLE row,
// through the device sampler (backend/cuda/sampling) so only the picks come back: a decode step
// copies 8 bytes a row instead of a 517 KB logits row, and the host samples nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cuda/device_model.h"
#include "engine/cuda/section_timer.h"
#include "engine/engine.h"

namespace ds41rt::engine::gpu {

// Whether m's device runs the sampler (thread-block clusters: sm_90 and later).
bool device_samples(const device_model &m);

// Samples rows [R, V] of device logits lg (R = specs.size()) as specs say, into *out (R
// entries); synchronises the stream once.
Status sample_on_device(const device_model &m, const float *lg, int64_t V, const std::vector<const sample_spec *> &specs,
                        std::vector<sample_result> *out);

// The end of a step, its one synchronisation: with SAMPLE rows (`samples`), their picks from the
// device sampler into *sampled (timed as section "sample" on prof); otherwise the R logits rows
// [R, V] of lg to the host array `logits`, or, with none, a plain sync.
Status finish_rows(const device_model &m, const float *lg, int64_t R, int64_t V,
                   const std::vector<const sample_spec *> &samples, std::vector<sample_result> *sampled, float *logits,
                   section_timer &prof);

}  // namespace ds41rt::engine::gpu
