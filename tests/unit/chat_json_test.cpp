// OpenAI JSON -> chat_request: request-level mapping (tools, response_format, thinking,
// reasoning_effort; decisions documented in src/text/chat_json.h, reasoning defaults from
// shared/specs/reference-system.md §3 "Reasoning effort") and one case per error path, each of
// which must name the JSON path.
#include <gtest/gtest.h>

#include "text/chat_json.h"

namespace ds41rt::text {
namespace {

const std::string BOS = "<｜begin▁of▁sentence｜>";
constexpr auto V4 = chat_encoding::DSV4;
constexpr auto V41 = chat_encoding::DSV41;

chat_request parse_ok(const std::string &body, chat_encoding enc = V41) {
    Result<chat_request> r = parse_chat_request_text(body, enc);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string() << "\n" << body;
    return r.is_ok() ? r.value() : chat_request{};
}

std::string prompt(const std::string &body, chat_encoding enc = V41) {
    Result<rendered_prompt> r = render_chat(parse_ok(body, enc), enc);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r->text : "";
}

void expect_error(const std::string &body, const std::string &needle, chat_encoding enc = V41,
                  status_code code = status_code::INVALID_ARGUMENT) {
    Result<chat_request> r = parse_chat_request_text(body, enc);
    ASSERT_FALSE(r.is_ok()) << body;
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

const std::string HI = R"("messages": [{"role": "user", "content": "Hi"}])";

// reference-system.md §3: thinking on at high effort by default; reasoning_effort low/high/max/
// none or thinking {type: disabled}.
TEST(chat_json, reasoning_switches) {
    const std::string line75 = "<｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
    EXPECT_EQ(prompt("{" + HI + "}"), BOS + line75 + "<｜User｜>Hi<｜Assistant｜><think>");
    EXPECT_EQ(parse_ok("{" + HI + R"(, "reasoning_effort": "low"})").effort.level, effort_level::LOW);
    EXPECT_EQ(parse_ok("{" + HI + R"(, "reasoning_effort": "max"})").effort.level, effort_level::MAX);
    chat_request b = parse_ok("{" + HI + R"(, "reasoning_effort": 33})");
    EXPECT_EQ(b.effort.level, effort_level::BUDGET);
    EXPECT_EQ(b.effort.budget, 33);
    EXPECT_EQ(parse_ok("{" + HI + R"(, "reasoning_effort": "none"})").thinking, thinking_mode::CHAT);
    EXPECT_EQ(parse_ok("{" + HI + R"(, "thinking": {"type": "disabled"}})").thinking, thinking_mode::CHAT);
    EXPECT_EQ(parse_ok("{" + HI + R"(, "thinking": {"type": "disabled"}, "reasoning_effort": "max"})").thinking,
              thinking_mode::CHAT);
    EXPECT_EQ(parse_ok("{" + HI + R"(, "thinking": {"type": "enabled"}})").thinking, thinking_mode::THINKING);
    EXPECT_EQ(prompt("{" + HI + R"(, "thinking": {"type": "disabled"}})"), BOS + "<｜User｜>Hi<｜Assistant｜></think>");

    expect_error("{" + HI + R"(, "thinking": {"type": "enabled"}, "reasoning_effort": "none"})", "reasoning_effort");
    expect_error("{" + HI + R"(, "reasoning_effort": "medium"})", "reasoning_effort");
    expect_error("{" + HI + R"(, "reasoning_effort": true})", "reasoning_effort");
    expect_error("{" + HI + R"(, "reasoning_effort": 1.5})", "reasoning_effort");
    expect_error("{" + HI + R"(, "reasoning_effort": 0})", "reasoning_effort");
    expect_error("{" + HI + R"(, "reasoning_effort": 101})", "reasoning_effort");
    expect_error("{" + HI + R"(, "reasoning_effort": 50})", "V4.1", V4);
    expect_error("{" + HI + R"(, "thinking": {"type": "maybe"}})", "thinking.type");
    expect_error("{" + HI + R"(, "thinking": true})", "thinking");
}

// chat_json.h: request tools go on the first system message, or on an inserted empty one.
TEST(chat_json, request_tools_attach_to_first_system) {
    const std::string tools =
        R"("tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}}])";
    chat_request with_sys = parse_ok(R"({"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "S"}], )" + tools + "}");
    ASSERT_EQ(with_sys.messages.size(), 2u);
    ASSERT_EQ(with_sys.messages[1].tools.size(), 1u);
    chat_request no_sys = parse_ok("{" + HI + ", " + tools + "}");
    ASSERT_EQ(no_sys.messages.size(), 2u);
    EXPECT_EQ(no_sys.messages[0].role, chat_role::SYSTEM);
    EXPECT_EQ(no_sys.messages[0].content, "");
    // Key order of the schema survives into the prompt ("z" before "a").
    std::string p = prompt("{" + HI + ", " + tools + R"(, "thinking": {"type": "disabled"}})", V4);
    EXPECT_EQ(p.rfind(BOS + "\n\n## Tools\n\n", 0), 0u) << p;
    EXPECT_NE(p.find(R"({"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}})"),
              std::string::npos);
}

TEST(chat_json, response_format) {
    std::string p = prompt("{" + HI + R"(, "thinking": {"type": "disabled"}, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}})");
    EXPECT_EQ(p, BOS + "<｜System｜>\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{\"type\": \"object\"}<｜User｜>Hi<｜Assistant｜></think>");
    EXPECT_EQ(parse_ok("{" + HI + R"(, "response_format": {"type": "json_object"}})").messages.size(), 1u);
    expect_error("{" + HI + R"(, "response_format": {"type": "yaml"}})", "response_format.type");
    expect_error("{" + HI + R"(, "response_format": {"type": "json_schema"}})", "response_format.json_schema");
}

TEST(chat_json, message_shapes) {
    chat_request r = parse_ok(R"({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "reasoning_content": "r",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"y\": 1, \"x\": \"s\"}"}},
                        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "R2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "R1"},
        {"role": "assistant", "content": "Sure", "prefix": true}]})");
    ASSERT_EQ(r.messages.size(), 5u);
    EXPECT_EQ(r.messages[0].content, "a\n\nb");
    EXPECT_EQ(r.messages[1].tool_calls[0].arguments.begin().key(), "y");
    EXPECT_TRUE(r.messages[1].tool_calls[1].arguments.empty());
    EXPECT_EQ(r.messages[2].content, "R2");
    EXPECT_TRUE(r.messages[4].no_eos);
}

TEST(chat_json, errors_name_the_path) {
    expect_error("[]", "request");
    expect_error("{", "not valid JSON");
    expect_error("{}", "messages");
    expect_error(R"({"messages": {}})", "messages");
    expect_error(R"({"messages": []})", "messages");
    expect_error(R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role");
    expect_error(R"({"messages": [{"content": "x"}]})", "messages[0].role");
    expect_error(R"({"messages": [{"role": "user", "content": 7}]})", "messages[0].content");
    expect_error(R"({"messages": [{"role": "user"}]})", "messages[0].content");
    expect_error(R"({"messages": [{"role": "user", "content": [{"type": "audio"}]}]})", "messages[0].content[0].type");
    expect_error(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
                 "image", V41, status_code::NOT_SUPPORTED);
    expect_error(R"({"messages": [{"role": "user", "content": "q", "reasoning_content": "r"}]})", "messages[0].reasoning_content");
    expect_error(R"({"messages": [{"role": "user", "content": "q", "task": "dance"}]})", "messages[0].task");
    expect_error(R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "c", "content": "r"}]})",
                 "messages[1]: tool message does not follow");
    const std::string call = R"({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]})";
    expect_error(R"({"messages": [{"role": "user", "content": "q"}, )" + call + R"(, {"role": "tool", "tool_call_id": "zz", "content": "r"}]})",
                 "messages[2]: tool_call_id 'zz'");
    expect_error(R"({"messages": [{"role": "user", "content": "q"}, )" + call + R"(, {"role": "tool", "content": "r"}]})",
                 "messages[2]: tool message needs a tool_call_id");
    expect_error(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]})",
                 "messages[0].tool_calls[0].function.arguments: not valid JSON");
    expect_error(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]})",
                 "messages[0].tool_calls[0].function.arguments: must encode a JSON object");
    expect_error(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
                 "messages[0].tool_calls[0].function.name");
    expect_error(R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}]})",
                 "messages[0].tool_calls[0].type");
    expect_error(R"({"messages": [{"role": "assistant", "content": "a", "prefix": true}, {"role": "user", "content": "q"}]})",
                 "messages[0]: only the final assistant message");
    expect_error(R"({"messages": [{"role": "developer", "content": ""}]})", "messages[0]: a developer message needs content");
    expect_error("{" + HI + R"(, "tools": [{"type": "function", "function": {"description": "no name"}}]})", "tools[0].function.name");
}

}  // namespace
}  // namespace ds41rt::text
