// py_json_dumps against Python 3's json.dumps(v, ensure_ascii=False): every expected string here
// was printed by CPython 3 (json.dumps of the same value), the serializer DeepSeek's encoders use.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "text/py_json.h"

namespace ds41rt::text {
namespace {

using ojson = nlohmann::ordered_json;

TEST(py_json, floats_follow_python_repr) {
    const std::pair<double, const char *> cases[] = {
        {0.0, "0.0"},         {-0.0, "-0.0"},       {1.0, "1.0"},       {1.5, "1.5"},
        {0.1, "0.1"},         {1e-05, "1e-05"},     {0.0001, "0.0001"}, {1e16, "1e+16"},
        {1e15, "1000000000000000.0"},               {123456789012345678.0, "1.2345678901234568e+17"},
        {1.7976931348623157e308, "1.7976931348623157e+308"},            {5e-324, "5e-324"},
        {-2.5e-10, "-2.5e-10"}, {100.0, "100.0"},   {3.14159, "3.14159"}, {1e22, "1e+22"},
        {12345.678, "12345.678"},
    };
    for (const auto &[v, want] : cases) EXPECT_EQ(py_json_dumps(ojson(v)), want) << want;
}

TEST(py_json, separators_order_and_escapes) {
    ojson v = ojson::parse("{\"a\": \"\\u00e9\\n\\t\\\"\\\\\\u0001\\u007f/\", \"b\": [1, -2, true, null, {}], \"c\": []}");
    EXPECT_EQ(py_json_dumps(v), "{\"a\": \"é\\n\\t\\\"\\\\\\u0001\x7f/\", \"b\": [1, -2, true, null, {}], \"c\": []}");
    // Key order is the order received (ordered_json), not sorted.
    EXPECT_EQ(py_json_dumps(ojson::parse(R"({"z": 1, "a": 2})")), R"({"z": 1, "a": 2})");
    EXPECT_EQ(py_json_dumps(ojson::parse("9223372036854775808")), "9223372036854775808");
    EXPECT_EQ(py_json_dumps(ojson::parse("-9223372036854775808")), "-9223372036854775808");
}

}  // namespace
}  // namespace ds41rt::text
