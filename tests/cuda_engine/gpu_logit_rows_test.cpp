// engine::step's logit_rows on the GPU engine (the tiny synthesized V4.1 model), where mixed
// choices in one batch gather the returned rows before the head: see logit_rows_check.h.
#include <gtest/gtest.h>

#include "logit_rows_check.h"

namespace ds41rt {
namespace {

TEST(GpuLogitRows, GpuEngineReturnsTheRowsAskedFor) {
    engine::engine_options o;
    o.backend = engine::backend_kind::CUDA;
    testing_util::check_logit_rows_on_tiny_model(o, "gpu_logit_rows");
}

}  // namespace
}  // namespace ds41rt
