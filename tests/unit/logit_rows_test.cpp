// engine::step's logit_rows on the CPU engine (the tiny synthesized V4.1 model): see
// logit_rows_check.h; and SAMPLE rows (step_sampled, and steps issued ahead).
#include <gtest/gtest.h>

#include "logit_rows_check.h"

namespace ds41rt {
namespace {

TEST(LogitRows, CpuEngineReturnsTheRowsAskedFor) {
    testing_util::on_tiny_model({}, "logit_rows", testing_util::check_logit_rows);
}

TEST(LogitRows, CpuEngineSamplesSampleRowsAsTheHostSamplerDoes) {
    testing_util::on_tiny_model({}, "sampled_step", testing_util::check_sampled_step);
}

TEST(LogitRows, CpuEngineStepsIssuedAheadPickAsStepSampled) {
    testing_util::on_tiny_model({}, "issued_steps", testing_util::check_issued_steps);
}

}  // namespace
}  // namespace ds41rt
