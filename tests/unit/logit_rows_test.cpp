// engine::step's logit_rows on the CPU engine (the tiny synthesized V4.1 model): see
// logit_rows_check.h.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "engine/engine.h"
#include "logit_rows_check.h"
#include "model/synth.h"
#include "tiny_synth.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

TEST(LogitRows, CpuEngineReturnsTheRowsAskedFor) {
    const fs::path dir = fs::temp_directory_path() / ("ds41rt_logit_rows_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    Status st = model::synthesize(dir.string(), tiny_synth());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    auto e = engine::engine::open(dir.string(), {});
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    testing_util::check_logit_rows(**e);
    fs::remove_all(dir);
}

}  // namespace
}  // namespace ds41rt
