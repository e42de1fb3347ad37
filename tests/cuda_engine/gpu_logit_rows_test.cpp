// engine::step's logit_rows on the GPU engine (the tiny synthesized V4.1 model), where mixed
// choices in one batch gather the returned rows before the head: see logit_rows_check.h.
#include <gtest/gtest.h>

#include "logit_rows_check.h"

namespace ds41rt {
namespace {

TEST(GpuLogitRows, GpuEngineReturnsTheRowsAskedFor) {
    engine::engine_options o;
    o.backend = engine::backend_kind::CUDA;
    testing_util::on_tiny_model(o, "gpu_logit_rows", testing_util::check_logit_rows);
}

// SAMPLE rows picked by the device sampler (every returned row of the step is a SAMPLE row), the
// same tokens as the host sampler on the rows a LAST step returns.
TEST(GpuLogitRows, GpuEngineSamplesOnTheDeviceAsTheHost) {
    engine::engine_options o;
    o.backend = engine::backend_kind::CUDA;
    testing_util::on_tiny_model(o, "gpu_sampled_step", testing_util::check_sampled_step);
}

// Steps issued ahead (issue_sampled / collect_sampled) pick what step_sampled picks.
TEST(GpuLogitRows, GpuEngineStepsIssuedAheadPickAsStepSampled) {
    engine::engine_options o;
    o.backend = engine::backend_kind::CUDA;
    testing_util::on_tiny_model(o, "gpu_issued_steps", testing_util::check_issued_steps);
}

}  // namespace
}  // namespace ds41rt
