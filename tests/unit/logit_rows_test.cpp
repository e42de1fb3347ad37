// engine::step's logit_rows on the CPU engine (the tiny synthesized V4.1 model): see
// logit_rows_check.h.
#include <gtest/gtest.h>

#include "logit_rows_check.h"

namespace ds41rt {
namespace {

TEST(LogitRows, CpuEngineReturnsTheRowsAskedFor) { testing_util::check_logit_rows_on_tiny_model({}, "logit_rows"); }

}  // namespace
}  // namespace ds41rt
