// The tiny fixture tokenizer (tests/fixtures/deepseek-v41-flash-quant/tokenizer.json: a lone
// ByteLevel pre-tokenizer with GPT-2's regex, 512 ids) against ids HF tokenizers 0.23.3 produced
// for the same strings (Tokenizer.from_file(...).encode(s).ids), and its byte-exact round trip.
#include <gtest/gtest.h>

#include <filesystem>

#include "text/tokenizer.h"

using namespace ds41rt;

namespace {

std::string fixture_tokenizer() {
    return std::string(DS41RT_FIXTURES_DIR) + "/deepseek-v41-flash-quant/tokenizer.json";
}

}  // namespace

TEST(TokenizerGpt2, TinyFixtureMatchesHf) {
    if (!std::filesystem::exists(fixture_tokenizer())) GTEST_SKIP() << "no " << fixture_tokenizer();
    auto t = text::tokenizer::load(fixture_tokenizer());
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
        {"Hello, world! It's 2024.", {42, 71, 78, 78, 81, 14, 320, 271, 78, 70, 3, 223, 43, 86, 9, 85, 223, 20, 339, 22, 16}},
        {"  two  spaces\n\nnew lines\t tab ", {223, 358, 223, 294, 82, 67, 69, 267, 201, 201, 80, 388, 279, 268, 267, 200, 263, 375, 223}},
        {"na\xC3\xAFve caf\xC3\xA9 \xE6\x9D\xB1\xE4\xBA\xAC 123456 don't we'll",
         {80, 474, 223, 69, 471, 223, 165, 254, 112, 163, 121, 108, 223, 19, 20, 21, 22, 23, 24, 361, 80, 9, 86, 320, 71, 9, 78, 78}},
        {"<bos>Hi<eos> x", {0, 42, 75, 1, 223, 90}},
        {"<\xEF\xBD\x9CUser\xEF\xBD\x9C>hi<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>",
         {30, 334, 253, 55, 85, 259, 334, 253, 32, 74, 75, 30, 334, 253, 35, 85, 85, 75, 85, 86, 67, 80, 86, 334, 253, 32, 30, 86, 74, 268, 77, 32}},
    };
    for (const auto &[s, want] : cases) {
        EXPECT_EQ(t->encode(s), want) << s;
        EXPECT_EQ(t->decode_bytes(t->encode(s)), s);
    }
    EXPECT_EQ(t->vocab_size(), 512);
}
