// The full-size configs built into the binary (model/flash_configs, what `ds41rt plan
// --model-type` plans against) must stay equal to the config.json files kept as fixtures
// (tests/fixtures/configs, written from the specs' config tables; provenance in its README):
// two copies, one truth.
#include "model/flash_configs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

using namespace ds41rt;

namespace {

nlohmann::json read_json(const std::string &path) {
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << path;
    std::stringstream ss;
    ss << f.rdbuf();
    return nlohmann::json::parse(ss.str());
}

}  // namespace

TEST(flash_configs, built_in_configs_equal_the_released_files) {
    const std::string dir = std::string(DS41RT_FIXTURES_DIR) + "/configs/";
    EXPECT_EQ(nlohmann::json::parse(model::flash_config_json(model::arch::V41)), read_json(dir + "deepseek-v41-flash.json"));
    EXPECT_EQ(nlohmann::json::parse(model::flash_config_json(model::arch::V4)), read_json(dir + "deepseek-v4-flash.json"));
}
