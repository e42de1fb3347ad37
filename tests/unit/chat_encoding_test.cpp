// Chat encoding: the official golden vectors (tests/fixtures/chat, provenance in its README) and
// cases written from the specs, each naming its source. "V4 spec" is
// shared/specs/deepseek-v4-flash.md, "V4.1 spec" is shared/specs/deepseek-v41-flash.md;
// "encoding_dsv4.py" is DeepSeek's official V4 encoder (Mockingjay1316/deepseek-v4-flash-spark
// @ae059d9, encoding/encoding_dsv4.py) and "encoding_dsv41.py" the official V4.1 encoder as
// vendored unmodified in ztxz16/fastllm @fd873f3 (tools/fastllm_pytools/encoding_dsv41.py).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/chat_encoding.h"
#include "text/chat_json.h"

namespace ds41rt::text {
namespace {

using ojson = nlohmann::ordered_json;

const std::string BOS = "<｜begin▁of▁sentence｜>";
const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string U = "<｜User｜>";
const std::string A = "<｜Assistant｜>";
const std::string SYS = "<｜System｜>";

std::string read_file(const std::string &rel) {
    std::ifstream f(std::string(DS41RT_FIXTURES_DIR) + "/chat/" + rel, std::ios::binary);
    EXPECT_TRUE(f.good()) << rel;
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

chat_message msg(chat_role r, std::string content) {
    chat_message m;
    m.role = r;
    m.content = std::move(content);
    return m;
}
chat_message sys(std::string c) { return msg(chat_role::SYSTEM, std::move(c)); }
chat_message user(std::string c) { return msg(chat_role::USER, std::move(c)); }
chat_message asst(std::string content, std::string reasoning = "") {
    chat_message m = msg(chat_role::ASSISTANT, std::move(content));
    m.reasoning_content = std::move(reasoning);
    return m;
}
chat_message tool(std::string id, std::string content) {
    chat_message m = msg(chat_role::TOOL, std::move(content));
    m.tool_call_id = std::move(id);
    return m;
}
chat_tool_call call(std::string id, std::string name, const char *args_json) {
    return {std::move(id), std::move(name), ojson::parse(args_json)};
}

std::string render(const chat_request &req, chat_encoding enc) {
    Result<rendered_prompt> r = render_chat(req, enc);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r->text : "";
}
std::string render(std::vector<chat_message> msgs, chat_encoding enc, thinking_mode t,
                   reasoning_effort e = {}, bool drop = true) {
    chat_request req;
    req.messages = std::move(msgs);
    req.thinking = t;
    req.effort = e;
    req.drop_thinking = drop;
    return render(req, enc);
}
Status render_error(std::vector<chat_message> msgs, chat_encoding enc, reasoning_effort e = {}) {
    chat_request req;
    req.messages = std::move(msgs);
    req.effort = e;
    return render_chat(req, enc).status();
}

const reasoning_effort LOW{effort_level::LOW, 0}, HIGH{effort_level::HIGH, 0}, MAX{effort_level::MAX, 0};
reasoning_effort budget(int32_t b) { return {effort_level::BUDGET, b}; }
constexpr auto THINK = thinking_mode::THINKING;
constexpr auto CHAT = thinking_mode::CHAT;
constexpr auto V4 = chat_encoding::DSV4;
constexpr auto V41 = chat_encoding::DSV41;

// ---- official golden vectors -------------------------------------------------------------------
//
// A golden case file is either a bare message list or {messages, tools?, thinking_mode?}; case
// tools attach to messages[0] (the official harnesses do exactly this). Thinking modes are those
// the harnesses pass: V4 test_encoding_dsv4.py cases 1-3 thinking, case 4 chat; the V4.1 set
// reads thinking_mode from the file, defaulting to chat.

struct golden_case {
    const char *dir;
    int n;
    chat_encoding enc;
    thinking_mode thinking;
    reasoning_effort effort;
};

chat_request load_golden(const golden_case &g) {
    ojson data = ojson::parse(read_file(std::string(g.dir) + "/test_input_" + std::to_string(g.n) + ".json"));
    ojson messages = data.is_array() ? data : data["messages"];
    if (data.is_object() && data.contains("tools")) messages[0]["tools"] = data["tools"];
    Result<std::vector<chat_message>> parsed = parse_chat_messages(messages);
    EXPECT_TRUE(parsed.is_ok()) << parsed.status().to_string();
    chat_request req;
    if (parsed.is_ok()) req.messages = parsed.value();
    req.thinking = g.thinking;
    req.effort = g.effort;
    return req;
}

class golden : public ::testing::TestWithParam<golden_case> {};

TEST_P(golden, renders_byte_exact) {
    const golden_case &g = GetParam();
    std::string want = read_file(std::string(g.dir) + "/test_output_" + std::to_string(g.n) + ".txt");
    std::string got = render(load_golden(g), g.enc);
    EXPECT_EQ(got, want);
    if (got != want) {  // point at the first difference: long prompts are hard to diff by eye
        size_t i = 0;
        while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
        ADD_FAILURE() << "first difference at byte " << i << ": got '" << got.substr(i, 60) << "' want '"
                      << want.substr(i, 60) << "'";
    }
}

// V4.1 case 1 has no reasoning_effort and was rendered by a pre-release encoder whose default
// budget was 50 (the released encoder's default is 75, see V4.1 spec §9.2 item 2 and
// tests/fixtures/chat/README.md); passing the number 50 renders the same bytes under both.
INSTANTIATE_TEST_SUITE_P(
    official, golden,
    ::testing::Values(golden_case{"dsv4", 1, V4, THINK, {}}, golden_case{"dsv4", 2, V4, THINK, {}},
                      golden_case{"dsv4", 3, V4, THINK, {}}, golden_case{"dsv4", 4, V4, CHAT, {}},
                      golden_case{"dsv41", 1, V41, THINK, budget(50)}, golden_case{"dsv41", 2, V41, CHAT, {}},
                      golden_case{"dsv41", 3, V41, CHAT, {}}, golden_case{"dsv41", 4, V41, CHAT, {}}),
    [](const ::testing::TestParamInfo<golden_case> &info) {
        return std::string(info.param.dir) + "_case_" + std::to_string(info.param.n);
    });

// The V4 golden case 2 asserts that the earlier turn's reasoning is gone (test_encoding_dsv4.py,
// test_case_2: "The user said hello" not in prompt).
TEST(chat_encoding_golden, v4_case2_drops_earlier_reasoning) {
    std::string got = render(load_golden({"dsv4", 2, V4, THINK, {}}), V4);
    EXPECT_EQ(got.find("The user said hello"), std::string::npos);
}

// ---- V4 (encoding_dsv4), cases written from the spec ------------------------------------------

// Source: encoding/README.md "Quick Start" of the official V4 encoder (same commit as the goldens).
TEST(chat_encoding_v4, readme_quick_start_thinking) {
    EXPECT_EQ(render({sys("You are a helpful assistant."), user("What is 2+2?")}, V4, THINK),
              BOS + "You are a helpful assistant." + U + "What is 2+2?" + A + "<think>");
}

// Source: V4 spec §6.2 ("system message is raw text with no role token"; "</think> in chat mode").
TEST(chat_encoding_v4, chat_mode_closes_thinking_at_once) {
    EXPECT_EQ(render({sys("SYS"), user("Hi")}, V4, CHAT), BOS + "SYS" + U + "Hi" + A + "</think>");
    EXPECT_EQ(render({user("Hi")}, V4, CHAT), BOS + U + "Hi" + A + "</think>");
}

// Source: V4 spec §6.2 example "…<｜User｜>Hello<｜Assistant｜></think>Hi…<｜end▁of▁sentence｜>
// <｜User｜>Q?<｜Assistant｜><think>R</think>A<｜end▁of▁sentence｜>": an earlier turn's reasoning is
// dropped (and its header closed), the last turn keeps its reasoning.
TEST(chat_encoding_v4, multi_turn_drops_earlier_reasoning) {
    EXPECT_EQ(render({user("Hello"), asst("Hi", "greeting"), user("Q?"), asst("A", "R")}, V4, THINK),
              BOS + U + "Hello" + A + "</think>Hi" + EOS + U + "Q?" + A + "<think>R</think>A" + EOS);
    // Generation prompt after a multi-turn history.
    EXPECT_EQ(render({user("q1"), asst("a1", "r1"), user("q2")}, V4, THINK),
              BOS + U + "q1" + A + "</think>a1" + EOS + U + "q2" + A + "<think>");
}

// Source: encoding_dsv4.py render_message (drop_thinking=False: every kept assistant turn keeps
// "{reasoning}</think>", every user turn opens "<think>").
TEST(chat_encoding_v4, drop_thinking_off_keeps_all_reasoning) {
    EXPECT_EQ(render({user("q1"), asst("a1", "r1"), user("q2")}, V4, THINK, {}, /*drop=*/false),
              BOS + U + "q1" + A + "<think>r1</think>a1" + EOS + U + "q2" + A + "<think>");
}

// Source: V4 spec §6.2 "drop_thinking ... is auto-disabled when any message has tools".
TEST(chat_encoding_v4, tools_disable_drop_thinking) {
    chat_message s = sys("S");
    s.tools.push_back(ojson::parse(R"({"name": "f", "parameters": {"type": "object"}})"));
    std::string p = render({s, user("q1"), asst("a1", "r1"), user("q2")}, V4, THINK);
    EXPECT_NE(p.find(U + "q1" + A + "<think>r1</think>a1" + EOS), std::string::npos) << p;
    EXPECT_NE(p.find("\n\n## Tools\n\n"), std::string::npos);
    EXPECT_NE(p.find("{\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}\n\nYou MUST strictly follow"),
              std::string::npos);
}

// Source: V4 spec §6.2 "Reasoning effort: only "max" changes the prompt ... before the system
// text, in thinking mode"; the paragraph text from encoding/README.md "Reasoning Effort".
TEST(chat_encoding_v4, every_reasoning_effort) {
    const std::string max_text =
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
        "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
        "adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
        "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";
    std::vector<chat_message> m = {sys("SYS"), user("Hi")};
    const std::string plain = BOS + "SYS" + U + "Hi" + A + "<think>";
    EXPECT_EQ(render(m, V4, THINK, MAX), BOS + max_text + "SYS" + U + "Hi" + A + "<think>");
    EXPECT_EQ(render(m, V4, THINK, HIGH), plain);
    EXPECT_EQ(render(m, V4, THINK, {}), plain);
    EXPECT_EQ(render(m, V4, THINK, LOW), plain);  // decision: "low" = normal thinking (the V4 encoder has no low)
    EXPECT_EQ(render(m, V4, CHAT, MAX), BOS + "SYS" + U + "Hi" + A + "</think>");
    Status s = render_error(m, V4, budget(50));
    EXPECT_EQ(s.code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(s.message().find("V4.1"), std::string::npos) << s.message();
}

// Source: V4 spec §6.2 tool-call syntax and "Tool results ... merged into a user turn as
// <tool_result> blocks (joined by \n\n and sorted by call order)".
TEST(chat_encoding_v4, tool_calls_and_results_sorted_by_call_order) {
    chat_message a = asst("");
    a.tool_calls = {call("call_a", "get_weather", R"({"city": "Paris", "days": 3})"),
                    call("call_b", "lookup", R"({"ids": [1, 2], "opts": {"deep": true, "ratio": 0.5}, "q": null})")};
    std::string p = render({user("weather?"), a, tool("call_b", "RB"), tool("call_a", "RA")}, V4, CHAT);
    EXPECT_EQ(p, BOS + U + "weather?" + A + "</think>" +
                     "\n\n<｜DSML｜tool_calls>\n"
                     "<｜DSML｜invoke name=\"get_weather\">\n"
                     "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
                     "</｜DSML｜invoke>\n"
                     "<｜DSML｜invoke name=\"lookup\">\n"
                     "<｜DSML｜parameter name=\"ids\" string=\"false\">[1, 2]</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"deep\": true, \"ratio\": 0.5}</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"q\" string=\"false\">null</｜DSML｜parameter>\n"
                     "</｜DSML｜invoke>\n"
                     "</｜DSML｜tool_calls>" + EOS +
                     U + "<tool_result>RA</tool_result>\n\n<tool_result>RB</tool_result>" + A + "</think>");
}

// Source: encoding_dsv4.py merge_tool_messages (a user message after tool results joins the same
// user turn as another "\n\n"-joined block) and render_message (tool calls follow content).
TEST(chat_encoding_v4, user_text_after_tool_results_joins_the_turn) {
    chat_message a = asst("Let me look.", "need data");
    a.tool_calls = {call("c1", "f", "{}")};
    std::string p = render({user("q"), a, tool("c1", "R1"), user("thanks, go on")}, V4, THINK, {}, false);
    EXPECT_EQ(p, BOS + U + "q" + A + "<think>need data</think>Let me look." +
                     "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
                     EOS + U + "<tool_result>R1</tool_result>\n\nthanks, go on" + A + "<think>");
}

// Source: V4 spec §6.2 ("response_format schema goes in a '## Response Format' block") and
// encoding_dsv4.py response_format_template.
TEST(chat_encoding_v4, response_format_block) {
    chat_message s = sys("S");
    s.response_format = ojson::parse(R"({"type": "object", "properties": {"x": {"type": "number"}}})");
    EXPECT_EQ(render({s, user("u")}, V4, CHAT),
              BOS + "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                    "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}}" +
                  U + "u" + A + "</think>");
}

// Source: V4 spec §6.2 "latest_reminder role -> <｜latest_reminder｜>{content}" and "developer
// role -> <｜User｜>…"; encoding_dsv4.py _drop_thinking_messages (developer turns before the last
// user turn are dropped in thinking mode).
TEST(chat_encoding_v4, latest_reminder_and_developer) {
    chat_message dev = msg(chat_role::DEVELOPER, "D");
    EXPECT_EQ(render({msg(chat_role::LATEST_REMINDER, "2026-01-01"), dev}, V4, CHAT),
              BOS + "<｜latest_reminder｜>2026-01-01" + U + "D" + A + "</think>");
    EXPECT_EQ(render({dev, asst("a", "r"), user("q")}, V4, THINK), BOS + "a" + EOS + U + "q" + A + "<think>");
    EXPECT_EQ(render_error({msg(chat_role::DEVELOPER, "")}, V4).code(), status_code::INVALID_ARGUMENT);
}

// Source: encoding_dsv4.py render_message (wo_eos: the assistant turn is a prefix to continue)
// and the task branch (non-action task token right after the message; V4 spec §6.2 quick
// instruction tasks).
TEST(chat_encoding_v4, prefix_and_task_tokens) {
    chat_message a = asst("Sure, ", "r");
    a.no_eos = true;
    EXPECT_EQ(render({user("q"), a}, V4, THINK), BOS + U + "q" + A + "<think>r</think>Sure, ");
    chat_message q = user("classify me");
    q.task = chat_task::QUERY;
    EXPECT_EQ(render({q}, V4, CHAT), BOS + U + "classify me<｜query｜>");
    chat_message act = user("act");
    act.task = chat_task::ACTION;
    EXPECT_EQ(render({act}, V4, THINK), BOS + U + "act" + A + "<think><｜action｜>");
    chat_message early = asst("x");
    early.no_eos = true;
    EXPECT_EQ(render_error({user("q"), early, user("q2")}, V4).code(), status_code::INVALID_ARGUMENT);
}

// ---- V4.1 (encoding_dsv41), cases written from the spec ---------------------------------------

// Source: V4.1 spec §9.2 "Examples" (all three verbatim).
TEST(chat_encoding_v41, spec_examples) {
    EXPECT_EQ(render({user("Hi")}, V41, THINK),
              BOS + SYS + "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n" +
                  U + "Hi" + A + "<think>");
    EXPECT_EQ(render({user("Hi")}, V41, CHAT), BOS + U + "Hi" + A + "</think>");
    EXPECT_EQ(render({sys("SYS"), user("Hi")}, V41, CHAT), BOS + SYS + "SYS" + U + "Hi" + A + "</think>");
}

// Source: V4.1 spec §9.2 item 2 (low=50 / high=75 / max=100, default high, integers 1-100,
// thinking mode only) and encoding_dsv41.py REASONING_EFFORT_MAPPINGS.
TEST(chat_encoding_v41, every_reasoning_effort) {
    auto line = [](int n) {
        return BOS + SYS + "Reasoning Effort: " + std::to_string(n) +
               " (range 1-100, the higher the value, the more thorough the reasoning)\n\nSYS" + U + "Hi" + A + "<think>";
    };
    std::vector<chat_message> m = {sys("SYS"), user("Hi")};
    EXPECT_EQ(render(m, V41, THINK, {}), line(75));
    EXPECT_EQ(render(m, V41, THINK, LOW), line(50));
    EXPECT_EQ(render(m, V41, THINK, HIGH), line(75));
    EXPECT_EQ(render(m, V41, THINK, MAX), line(100));
    EXPECT_EQ(render(m, V41, THINK, budget(1)), line(1));
    EXPECT_EQ(render(m, V41, THINK, budget(42)), line(42));
    EXPECT_EQ(render(m, V41, THINK, budget(100)), line(100));
    EXPECT_EQ(render(m, V41, CHAT, MAX), BOS + SYS + "SYS" + U + "Hi" + A + "</think>");
    EXPECT_EQ(render_error(m, V41, budget(0)).code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(render_error(m, V41, budget(101)).code(), status_code::INVALID_ARGUMENT);
}

// Source: V4.1 spec §9.2 item 1: a mid-conversation system message is <｜System｜>{content}, is
// followed by the assistant header when nothing but the assistant follows, and counts as a user
// turn for thinking dropping and <think> placement.
TEST(chat_encoding_v41, mid_conversation_system) {
    EXPECT_EQ(render({sys("S"), user("q1"), asst("a1", "r1"), sys("mid")}, V41, THINK, budget(88)),
              BOS + SYS + "Reasoning Effort: 88 (range 1-100, the higher the value, the more thorough the reasoning)\n\n" +
                  "S" + U + "q1" + A + "</think>a1" + EOS + SYS + "mid" + A + "<think>");
    EXPECT_EQ(render({user("q1"), asst("a1"), sys("mid"), user("q2")}, V41, CHAT),
              BOS + U + "q1" + A + "</think>a1" + EOS + SYS + "mid" + U + "q2" + A + "</think>");
}

// Source: V4.1 spec §9.2 item 3 (DSML tag names gain a leading space) and the unchanged
// tool-result merge; the tools block is checked byte for byte by golden case dsv41_case_1.
TEST(chat_encoding_v41, spaced_dsml_tags_and_tool_results) {
    chat_message a = asst("", "think");
    a.tool_calls = {call("x", "lookup", R"({"query": "value", "limit": 2})")};
    std::string p = render({user("question"), a, tool("x", "found")}, V41, CHAT);
    EXPECT_EQ(p, BOS + U + "question" + A + "</think>" +
                     "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"lookup\">\n"
                     "<｜DSML｜ parameter name=\"query\" string=\"true\">value</｜DSML｜ parameter>\n"
                     "<｜DSML｜ parameter name=\"limit\" string=\"false\">2</｜DSML｜ parameter>\n"
                     "</｜DSML｜ invoke>\n</｜DSML｜ calls>" + EOS +
                     U + "<tool_result>found</tool_result>" + A + "</think>");
}

// Source: V4.1 spec §9.2 "Unchanged from V4: ... drop_thinking default (auto-off when tools are
// present)".
TEST(chat_encoding_v41, drop_thinking_and_rendered_flags) {
    chat_request req;
    req.messages = {user("q1"), asst("a1", "r1"), user("q2")};
    Result<rendered_prompt> r = render_chat(req, V41);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->text.find("r1"), std::string::npos);
    EXPECT_TRUE(r->starts_in_reasoning);
    req.thinking = CHAT;
    EXPECT_FALSE(render_chat(req, V41)->starts_in_reasoning);
}

// ---- validation -------------------------------------------------------------------------------

TEST(chat_encoding_validation, tool_messages_need_a_matching_call) {
    auto code = [](std::vector<chat_message> m) { return render_error(std::move(m), V41).code(); };
    EXPECT_EQ(code({user("q"), tool("c1", "r")}), status_code::INVALID_ARGUMENT);  // no call before it
    chat_message a = asst("");
    a.tool_calls = {call("c1", "f", "{}")};
    EXPECT_EQ(code({user("q"), a, tool("c2", "r")}), status_code::INVALID_ARGUMENT);            // unknown id
    EXPECT_EQ(code({user("q"), a, tool("", "r")}), status_code::INVALID_ARGUMENT);              // id missing
    EXPECT_EQ(code({user("q"), a, tool("c1", "r"), tool("c1", "r")}), status_code::INVALID_ARGUMENT);  // twice
    EXPECT_EQ(code({user("q"), a, tool("c1", "r"), user("u"), tool("c1", "r")}), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(code({user("q"), a, tool("c1", "r")}), status_code::OK);
    chat_message bad_tools = user("q");
    bad_tools.tools.push_back(ojson::object());
    EXPECT_EQ(code({bad_tools}), status_code::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace ds41rt::text
