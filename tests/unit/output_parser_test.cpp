// Output parser: every case is fed whole, at every single split point, and byte by byte, and must
// give identical results (chunk boundaries inside markers and inside UTF-8 sequences included).
// Sources: the official parse expectations of test_encoding_dsv4.py (V4 goldens), the output
// grammar of V4 spec §6.2 / V4.1 spec §9.2, and the decisions documented in output_parser.h.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/chat_encoding.h"
#include "text/output_parser.h"

namespace ds41rt::text {
namespace {

using ojson = nlohmann::ordered_json;
constexpr auto V4 = chat_encoding::DSV4;
constexpr auto V41 = chat_encoding::DSV41;
const std::string EOS = "<｜end▁of▁sentence｜>";

struct parsed {
    std::string reasoning, content;
    std::vector<output_tool_call> calls;
    std::vector<output_event> events;  // coalesced, in order
    std::string error;
    std::vector<std::string> notes;
    bool saw_eos = false;
};

bool same_call(const output_tool_call &a, const output_tool_call &b) {
    return a.index == b.index && a.id == b.id && a.name == b.name && a.arguments == b.arguments;
}

bool same(const parsed &a, const parsed &b) {
    if (a.reasoning != b.reasoning || a.content != b.content || a.error != b.error || a.notes != b.notes ||
        a.saw_eos != b.saw_eos || a.calls.size() != b.calls.size() || a.events.size() != b.events.size())
        return false;
    for (size_t i = 0; i < a.calls.size(); ++i)
        if (!same_call(a.calls[i], b.calls[i])) return false;
    for (size_t i = 0; i < a.events.size(); ++i) {
        if (a.events[i].kind != b.events[i].kind || a.events[i].text != b.events[i].text) return false;
        if (a.events[i].kind == output_kind::TOOL_CALL && !same_call(a.events[i].tool_call, b.events[i].tool_call))
            return false;
    }
    return true;
}

// Each emitted text piece must be complete UTF-8 on its own.
bool valid_utf8(const std::string &s) {
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > s.size()) return false;
        for (size_t k = 1; k < len; ++k)
            if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
        i += len;
    }
    return true;
}

parsed run(chat_encoding enc, bool reasoning_first, const std::vector<std::string> &chunks) {
    output_parser_options o;
    o.starts_in_reasoning = reasoning_first;
    output_parser p(enc, o);
    std::vector<output_event> all;
    auto take = [&](std::vector<output_event> ev) {
        for (output_event &e : ev) {
            EXPECT_TRUE(valid_utf8(e.text)) << "event text is not complete UTF-8";
            if (e.kind != output_kind::TOOL_CALL) {
                EXPECT_FALSE(e.text.empty());
            }
            all.push_back(std::move(e));
        }
    };
    for (const std::string &c : chunks) take(p.feed(c));
    take(p.finish());
    parsed r;
    r.events = coalesce_events(all);
    for (const output_event &e : all) {
        if (e.kind == output_kind::REASONING) r.reasoning += e.text;
        else if (e.kind == output_kind::CONTENT) r.content += e.text;
        else r.calls.push_back(e.tool_call);
    }
    r.error = p.tool_call_error();
    r.notes = p.tool_call_notes();
    r.saw_eos = p.saw_eos_text();
    return r;
}

// Parse `text` whole, then at every split point, then byte by byte; all must agree.
parsed parse_everywhere(chat_encoding enc, bool reasoning_first, const std::string &text) {
    parsed whole = run(enc, reasoning_first, {text});
    for (size_t k = 0; k <= text.size(); ++k) {
        parsed split = run(enc, reasoning_first, {text.substr(0, k), text.substr(k)});
        EXPECT_TRUE(same(whole, split)) << "split at byte " << k << " of: " << text;
        if (!same(whole, split)) break;
    }
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    EXPECT_TRUE(same(whole, run(enc, reasoning_first, bytes))) << "byte-by-byte: " << text;
    return whole;
}

ojson args(const output_tool_call &c) { return ojson::parse(c.arguments); }

std::string read_fixture(const std::string &rel) {
    std::ifstream f(std::string(DS41RT_FIXTURES_DIR) + "/chat/" + rel, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// ---- official expectations ----------------------------------------------------------------------

// Source: test_encoding_dsv4.py test_case_1: the assistant turns of golden output 1, cut after
// "<｜Assistant｜><think>", parse to these messages.
TEST(output_parser_official, v4_golden_1_turns) {
    std::string prompt = read_fixture("dsv4/test_output_1.txt");
    const std::string marker = "<｜Assistant｜><think>";
    size_t first = prompt.find(marker) + marker.size();
    size_t first_end = prompt.find("<｜User｜>", first);
    parsed tc = parse_everywhere(V4, true, prompt.substr(first, first_end - first));
    EXPECT_EQ(tc.reasoning, "The user wants to know the weather in Beijing. I should use the get_weather tool.");
    EXPECT_EQ(tc.content, "");
    ASSERT_EQ(tc.calls.size(), 1u);
    EXPECT_EQ(tc.calls[0].name, "get_weather");
    EXPECT_EQ(args(tc.calls[0]), ojson::parse(R"({"location": "Beijing", "unit": "celsius"})"));
    EXPECT_EQ(tc.calls[0].arguments, R"({"location": "Beijing", "unit": "celsius"})");
    EXPECT_TRUE(tc.error.empty());
    EXPECT_TRUE(tc.saw_eos);

    size_t last = prompt.rfind(marker) + marker.size();
    parsed fin = parse_everywhere(V4, true, prompt.substr(last));
    EXPECT_EQ(fin.reasoning, "Got the weather data. Let me format a nice response.");
    EXPECT_NE(fin.content.find("22°C"), std::string::npos);
    EXPECT_TRUE(fin.calls.empty());
}

// Source: test_encoding_dsv4.py test_case_2 (last assistant turn of golden output 2).
TEST(output_parser_official, v4_golden_2_last_turn) {
    std::string prompt = read_fixture("dsv4/test_output_2.txt");
    const std::string marker = "<｜Assistant｜><think>";
    parsed p = parse_everywhere(V4, true, prompt.substr(prompt.rfind(marker) + marker.size()));
    EXPECT_EQ(p.reasoning, "The user asks about the capital of France. It is Paris.");
    EXPECT_EQ(p.content, "The capital of France is Paris.");
    EXPECT_TRUE(p.calls.empty());
}

// The V4.1 golden 1 tool-call turn (tests/fixtures/chat/dsv41/test_output_1.txt).
TEST(output_parser_official, v41_golden_1_tool_turn) {
    std::string prompt = read_fixture("dsv41/test_output_1.txt");
    const std::string marker = "<｜Assistant｜><think>";
    size_t first = prompt.find(marker) + marker.size();
    parsed p = parse_everywhere(V41, true, prompt.substr(first, prompt.find("<｜User｜>", first) - first));
    EXPECT_EQ(p.reasoning, "The user wants the weather in Beijing. I should call get_weather.");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, R"({"location": "Beijing", "unit": "celsius"})");
}

// ---- streaming behaviour ------------------------------------------------------------------------

// Source: V4.1 spec §9.2 (spaced tags, reasoning until </think>, content until EOS or
// "\n\n<｜DSML｜ calls"); multi-byte text (2-, 3- and 4-byte UTF-8) next to every marker.
TEST(output_parser, v41_full_turn_every_split) {
    std::string out =
        "Ünïcode 推理 🙂 </think>答案：好的 🙂\n\n"
        "<｜DSML｜ calls>\n"
        "<｜DSML｜ invoke name=\"get_weather\">\n"
        "<｜DSML｜ parameter name=\"city\" string=\"true\">北京 \"quoted\" \\ tab\t</｜DSML｜ parameter>\n"
        "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n"
        "<｜DSML｜ parameter name=\"opts\" string=\"false\">{\"a\":[1,2.5,true,null]}</｜DSML｜ parameter>\n"
        "</｜DSML｜ invoke>\n"
        "<｜DSML｜ invoke name=\"noop\">\n\n</｜DSML｜ invoke>\n"
        "</｜DSML｜ calls>" + EOS;
    parsed p = parse_everywhere(V41, true, out);
    EXPECT_EQ(p.reasoning, "Ünïcode 推理 🙂 ");
    EXPECT_EQ(p.content, "答案：好的 🙂");
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].index, 0);
    EXPECT_EQ(p.calls[0].id, "call_0");
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments,
              "{\"city\": \"北京 \\\"quoted\\\" \\\\ tab\\t\", \"days\": 3, \"opts\": {\"a\": [1, 2.5, true, null]}}");
    EXPECT_EQ(p.calls[1].name, "noop");
    EXPECT_EQ(p.calls[1].arguments, "{}");
    EXPECT_TRUE(p.error.empty());
    ASSERT_EQ(p.events.size(), 4u);  // reasoning, content, call, call
    EXPECT_EQ(p.events[0].kind, output_kind::REASONING);
    EXPECT_EQ(p.events[1].kind, output_kind::CONTENT);
}

// Source: output_parser.h (chat mode: output starts as content; no EOS text: finish() ends it;
// a stray "</think>" in content is content).
TEST(output_parser, chat_mode_and_finish_without_eos) {
    parsed p = parse_everywhere(V4, false, "Hello </think> world\n\n");
    EXPECT_EQ(p.reasoning, "");
    EXPECT_EQ(p.content, "Hello </think> world\n\n");
    EXPECT_FALSE(p.saw_eos);
    // Reasoning cut by the length limit stays reasoning.
    parsed r = parse_everywhere(V4, true, "still thinking <｜DSML｜tool_calls>");
    EXPECT_EQ(r.reasoning, "still thinking <｜DSML｜tool_calls>");
    EXPECT_EQ(r.content, "");
}

// Source: output_parser.h (EOS text ends the output; text after it is ignored; content keeps
// whitespace before EOS as the official parser does).
TEST(output_parser, eos_text_ends_output) {
    parsed p = parse_everywhere(V41, true, "r</think>a  \n" + EOS + "ignored <｜DSML｜ calls>");
    EXPECT_EQ(p.reasoning, "r");
    EXPECT_EQ(p.content, "a  \n");
    EXPECT_TRUE(p.saw_eos);
}

// Source: V4 spec §6.2 (V4 tag names) and V4.1 spec §9.2 item 3: each parser knows only its own
// tags, so V4 tags in V4.1 output are plain content.
TEST(output_parser, tags_are_per_encoding) {
    std::string v4_block =
        "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
        "<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    parsed v4 = parse_everywhere(V4, false, v4_block + EOS);
    ASSERT_EQ(v4.calls.size(), 1u);
    EXPECT_EQ(v4.calls[0].arguments, "{\"a\": 1}");
    EXPECT_EQ(v4.content, "x");
    parsed v41 = parse_everywhere(V41, false, v4_block + EOS);
    EXPECT_TRUE(v41.calls.empty());
    EXPECT_EQ(v41.content, v4_block);
}

// Source: output_parser.h decision: text after the tool-call block is content again (leading
// whitespace dropped); a second block continues the call numbering.
TEST(output_parser, content_after_block_and_second_block) {
    std::string block = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    parsed p = parse_everywhere(V41, false, "a" + block + "\n b" + block + EOS);
    EXPECT_EQ(p.content, "ab");
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[1].index, 1);
    EXPECT_EQ(p.calls[1].id, "call_1");
}

// ---- malformed output: degrade, never lose text -------------------------------------------------

// Source: output_parser.h: a broken invoke goes back to content from the end of the last complete
// call (the "\n" between the two invokes included); earlier complete calls stay emitted;
// tool_call_error() says what broke.
TEST(output_parser, malformed_invoke_becomes_content) {
    std::string good = "<｜DSML｜ invoke name=\"ok\">\n</｜DSML｜ invoke>\n";
    std::string bad = "<｜DSML｜ invoke name=\"broken\">\nhello there</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    parsed p = parse_everywhere(V41, false, "pre\n\n<｜DSML｜ calls>\n" + good + bad + EOS);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "ok");
    EXPECT_EQ(p.content, "pre\n" + bad);
    EXPECT_NE(p.error.find("broken"), std::string::npos) << p.error;
}

TEST(output_parser, block_broken_before_any_call_is_all_content) {
    std::string text = "pre\n\n<｜DSML｜tool_calls>\nnot a tag";
    parsed p = parse_everywhere(V4, false, text + EOS);
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content, text);
    EXPECT_FALSE(p.error.empty());
}

TEST(output_parser, eos_inside_invoke_and_duplicate_parameter) {
    std::string cut = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">par";
    parsed p = parse_everywhere(V41, false, "c" + cut + EOS);
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content, "c" + cut);
    EXPECT_NE(p.error.find("'a'"), std::string::npos) << p.error;

    std::string dup = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
                      "<｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ parameter>\n"
                      "<｜DSML｜ parameter name=\"a\" string=\"true\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    parsed d = parse_everywhere(V41, false, dup);
    EXPECT_TRUE(d.calls.empty());
    EXPECT_EQ(d.content, dup);
    EXPECT_NE(d.error.find("duplicate"), std::string::npos) << d.error;
}

// Source: output_parser.h: a string="false" value that is not JSON becomes a string, noted.
TEST(output_parser, non_json_false_value_becomes_string) {
    std::string text = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
                       "<｜DSML｜ parameter name=\"n\" string=\"false\">not json</｜DSML｜ parameter>\n"
                       "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    parsed p = parse_everywhere(V41, false, text);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, "{\"n\": \"not json\"}");
    EXPECT_EQ(p.notes.size(), 1u);
    EXPECT_TRUE(p.error.empty());
}

// Complete invokes followed by EOS without the closing tag: the calls stand (output_parser.h).
TEST(output_parser, missing_block_close_keeps_complete_calls) {
    std::string text = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n";
    parsed p = parse_everywhere(V41, false, text + EOS);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.content, "");
    EXPECT_TRUE(p.error.empty());
}

// Invalid UTF-8 bytes become U+FFFD; a sequence cut by the end of output becomes one U+FFFD.
TEST(output_parser, invalid_utf8_is_replaced) {
    parsed p = parse_everywhere(V4, false, std::string("a\xFF" "b\xE4\xB8") + "c" + "\xF0\x9F\x99");
    EXPECT_EQ(p.content, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD");
}

// Source: encoding then parsing must round-trip (the parse of what the encoder writes for an
// assistant turn is that turn): V4.1 encoder output for tool calls with every JSON value type.
TEST(output_parser, round_trip_with_encoder) {
    for (chat_encoding enc : {V4, V41}) {
        chat_request req;
        chat_message u;
        u.content = "q";
        chat_message a;
        a.role = chat_role::ASSISTANT;
        a.reasoning_content = "why";
        a.content = "text";
        a.tool_calls.push_back({"c1", "f", ojson::parse(R"({"s": "v\n<x>", "i": -7, "f": 1e-07, "b": false,
                                                           "a": ["x", {"y": 2}], "o": {}, "n": null})")});
        a.tool_calls.push_back({"c2", "g", ojson::object()});
        req.messages = {u, a};
        req.drop_thinking = false;
        Result<rendered_prompt> r = render_chat(req, enc);
        ASSERT_TRUE(r.is_ok());
        const std::string marker = "<｜Assistant｜><think>";
        std::string turn = r->text.substr(r->text.find(marker) + marker.size());
        parsed p = parse_everywhere(enc, true, turn);
        EXPECT_EQ(p.reasoning, "why");
        EXPECT_EQ(p.content, "text");
        ASSERT_EQ(p.calls.size(), 2u);
        EXPECT_EQ(p.calls[0].arguments,
                  R"({"s": "v\n<x>", "i": -7, "f": 1e-07, "b": false, "a": ["x", {"y": 2}], "o": {}, "n": null})");
        EXPECT_EQ(p.calls[1].arguments, "{}");
    }
}

}  // namespace
}  // namespace ds41rt::text
