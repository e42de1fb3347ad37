// The output grammar of a chat turn that offers tools: DeepSeek's DSML tool-call block, as an
// XGrammar structural tag (JSON text for grammar_compiler::structural_tag).
//
// The shape is the one our encoder renders for an assistant tool call (chat_encoding.cpp,
// render_tool_calls, byte-exact against DeepSeek's goldens) and the output parser reads:
//   [reasoning "</think>"] "\n\n<｜DSML｜ calls>\n" invoke ("\n" invoke)* "\n</｜DSML｜ calls>" EOS
//   invoke = "<｜DSML｜ invoke name=\"NAME\">\n" (parameter "\n")* "</｜DSML｜ invoke>"
//   parameter = "<｜DSML｜ parameter name=\"KEY\" string=\"true\">raw text</｜DSML｜ parameter>"
//             | "<｜DSML｜ parameter name=\"KEY\" string=\"false\">JSON</｜DSML｜ parameter>"
// (V4 spells the tags "tool_calls" / "invoke" / "parameter" without the space). The parameters
// of each invoke follow the function's JSON schema through XGrammar's "deepseek_v4_1_xml" /
// "deepseek_xml" styles, which render exactly this parameter form; the assembly mirrors
// XGrammar's own builtin DeepSeek-V4 structural tags (python/xgrammar/builtin_structural_tag.py).
//
// Modes (OpenAI tool_choice):
//  - REQUIRED: the output is a calls block with at least one invoke of any offered function;
//  - NAMED: exactly one invoke of the named function;
//  - AUTO: free text, but once the model opens "<｜DSML｜ calls>" the block must be well formed
//    and name offered functions (the reference system's tool_decoding_assistance, default on);
//  - NONE: free text in which no calls block may start.
// A prompt that ends inside <think> (thinking mode) keeps its reasoning free: the constraint
// starts after "</think>". Functions with "strict": false get syntactically valid, schema-free
// arguments (as XGrammar's builtin does); "parameters" omitted means any arguments.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/chat_tokens.h"

namespace ds41rt::text {

enum class tool_choice_mode { NONE = 0, AUTO, REQUIRED, NAMED };

struct tool_grammar_request {
    chat_encoding encoding = chat_encoding::DSV41;
    std::vector<nlohmann::ordered_json> functions;  // OpenAI "function" objects (name, parameters, strict)
    tool_choice_mode mode = tool_choice_mode::AUTO;
    std::string named;                              // NAMED: the function to call
    bool starts_in_reasoning = false;               // the prompt ends with "<think>"
    bool parallel_tool_calls = true;                // false: at most one invoke
};

// The structural tag JSON; INVALID_ARGUMENT for a missing or unknown function name (naming the
// field: "tool_choice.function.name: ...", "tools[1].function.name: ...").
Result<std::string> tool_call_structural_tag(const tool_grammar_request &req);

}  // namespace ds41rt::text

namespace ds41rt::text {

// A JSON reply (response_format) after free reasoning: "reasoning </think>" then a JSON value
// valid under `schema` (true: any JSON), no whitespace between tokens beyond what JSON needs.
std::string reasoning_then_json_tag(const nlohmann::ordered_json &schema);

}  // namespace ds41rt::text
