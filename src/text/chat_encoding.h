// Chat encoding: an OpenAI-style conversation rendered into DeepSeek's prompt text.
//
// What crosses this boundary: a plain chat_request (messages, thinking mode, reasoning effort,
// drop_thinking) goes in; the prompt TEXT comes out, special tokens written as their literal
// strings for the tokenizer to map to ids. There is no Jinja template for these models: the
// official encoders are Python (encoding_dsv4.py for V4 Flash, encoding.py "encoding_dsv41" for
// V4.1 Flash), and this file reproduces their output byte for byte (golden tests in
// tests/unit/chat_encoding_test.cpp, vectors and provenance in tests/fixtures/chat/).
// JSON request parsing lives in chat_json.h; output parsing in output_parser.h.
//
// Thread safety: render_chat is a pure function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/chat_tokens.h"

namespace ds41rt::text {

enum class chat_role { SYSTEM = 0, DEVELOPER, USER, ASSISTANT, TOOL, LATEST_REMINDER };
const char *chat_role_name(chat_role r);

// DeepSeek "quick instruction" tasks (V4 spec §6.2): a task token ends the prompt instead of the
// normal assistant header. NONE for every ordinary request.
enum class chat_task { NONE = 0, ACTION, QUERY, AUTHORITY, DOMAIN, TITLE, READ_URL };

struct chat_tool_call {
    std::string id;         // OpenAI tool_call id; orders the tool results that answer it
    std::string name;
    nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // a JSON object
};

struct chat_message {
    chat_role role = chat_role::USER;
    std::string content;                          // text parts already joined
    std::string reasoning_content;                // assistant only
    std::vector<chat_tool_call> tool_calls;       // assistant only
    std::string tool_call_id;                     // tool only
    // system / developer only: OpenAI "function" objects (name, description, parameters, ...),
    // rendered whole and in the key order received.
    std::vector<nlohmann::ordered_json> tools;
    std::optional<nlohmann::ordered_json> response_format;  // system / developer only
    chat_task task = chat_task::NONE;             // user / developer (and V4.1 system) only
    bool no_eos = false;  // assistant: a prefix the model continues (no EOS after it)
};

enum class thinking_mode { THINKING = 0, CHAT };

// DEFAULT is "high". V4 renders only MAX (its fixed paragraph); V4.1 renders a numeric line
// with low=50, high=75, max=100 or BUDGET=n (1..100). BUDGET is V4.1 only.
enum class effort_level { DEFAULT = 0, LOW, HIGH, MAX, BUDGET };
struct reasoning_effort {
    effort_level level = effort_level::DEFAULT;
    int32_t budget = 0;  // used when level == BUDGET
};

struct chat_request {
    std::vector<chat_message> messages;
    thinking_mode thinking = thinking_mode::THINKING;
    reasoning_effort effort;
    // Drop reasoning_content of assistant turns before the last user turn (and developer turns
    // there). Ignored (treated as false) when any message declares tools, as the official
    // encoders do.
    bool drop_thinking = true;
};

struct rendered_prompt {
    std::string text;
    // The prompt ends with "<think>": the model's first output is reasoning, so the output
    // parser must start in its reasoning state.
    bool starts_in_reasoning = false;
};

// The checks render_chat runs first, callable on their own (the JSON parser does, so a bad request
// is rejected before any prompt work).
Status validate_chat_request(const chat_request &req, chat_encoding enc);

// Render `req` with the given encoding. Errors (INVALID_ARGUMENT) name the message index and
// the rule broken: a developer message without content, a tool message with no preceding call,
// an effort the encoding cannot express, a task on a role that cannot carry it.
Result<rendered_prompt> render_chat(const chat_request &req, chat_encoding enc);

// The number a V4.1 prompt shows for `e` (75 for DEFAULT); 0 when `e` is invalid.
int32_t v41_effort_budget(const reasoning_effort &e);

}  // namespace ds41rt::text
