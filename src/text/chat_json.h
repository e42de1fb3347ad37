// OpenAI chat-completions JSON -> chat_request (the plain struct render_chat takes).
//
// Only the fields that shape the prompt are read here: messages, tools, response_format,
// reasoning_effort and thinking. Everything else in the body (sampling, stream, n, ...) belongs
// to the server's request parser. Malformed input is an INVALID_ARGUMENT naming the JSON path
// ("messages[2].tool_calls[0].function.arguments: ..."); nothing here throws.
//
// Parse with nlohmann::ordered_json (or pass the body text): tool schemas and tool-call
// arguments are rendered in the key order the client sent, and std::map order would change the
// prompt.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/chat_encoding.h"

namespace ds41rt::text {

// Accepted beyond plain OpenAI (DeepSeek's own message fields): roles "developer" and
// "latest_reminder"; "reasoning_content" on assistant messages; "prefix": true on a final
// assistant message (continue it, no EOS); "task" (action, query, authority, domain, title,
// read_url); "tools" / "response_format" on a system or developer message.
//
// Request-level mapping:
//  - tools: the "function" objects go on the first system message; when there is none, an empty
//    system message is inserted first to carry them (nothing is inserted without tools).
//  - response_format: json_schema -> its "schema" object in the "## Response Format" block;
//    json_object and text -> no block (the grammar constraint enforces them).
//  - thinking {type: enabled|disabled} and reasoning_effort (low, high, max, none, or an
//    integer 1..100 for V4.1): default thinking at high effort; "none" or disabled -> chat mode.
//    disabled with an effort other than none ignores the effort; enabled with none is an error.
Result<chat_request> parse_chat_request(const nlohmann::ordered_json &body, chat_encoding enc);
Result<chat_request> parse_chat_request_text(std::string_view body, chat_encoding enc);

// Messages only (the "messages" array), same rules as above.
Result<std::vector<chat_message>> parse_chat_messages(const nlohmann::ordered_json &messages);

}  // namespace ds41rt::text
