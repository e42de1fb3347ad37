// The output constraint of a chat request: response_format, tools and tool_choice -> a compiled
// grammar (text/grammar.h), or none.
//
// Which constraint applies:
//  - response_format json_object / json_schema: the content is that JSON (json_schema.strict,
//    default false as in OpenAI, forbids properties the schema does not list). "text": none.
//  - tools with tool_choice "required" or {"type": "function", "function": {"name": N}}: the
//    output is a DSML tool-call block (at least one call, or exactly one call of N), arguments
//    valid under each function's "parameters" (text/tool_grammar.h). Combining this with a
//    JSON response_format is a 400.
//  - tools with "auto" (the default when tools are offered) or "none": the reference system's
//    tool_decoding_assistance (a DeepSeek-server extension, bool, default true): free text, but a
//    tool-call block the model opens must be well formed ("auto"), or may not start ("none").
//    tool_decoding_assistance: false leaves these unconstrained. A JSON response_format wins
//    over "auto": the reply is then that JSON.
//  - no tools and no JSON response_format: no grammar (the request decodes exactly as before).
// In thinking mode (the prompt ends with "<think>") the reasoning stays free and the constraint
// starts after "</think>", as XGrammar's builtin DeepSeek structural tags do: constraining the
// reasoning would change what the model was trained to write there.
//
// Errors (INVALID_ARGUMENT naming the field): tool_choice of an unknown shape or naming a tool
// that was not offered, a forced choice without tools, a schema XGrammar cannot compile
// (unsupported features included), a bad parallel_tool_calls / tool_decoding_assistance.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/chat_tokens.h"
#include "text/grammar.h"

namespace ds41rt::server {

// `body` was already accepted by text::parse_chat_request (tools and response_format are well
// formed). Returns null when the request is unconstrained.
Result<std::shared_ptr<const text::grammar>> chat_grammar(const nlohmann::ordered_json &body,
                                                          text::grammar_compiler &compiler,
                                                          text::chat_encoding encoding, bool starts_in_reasoning);

}  // namespace ds41rt::server
