// OpenAI request bodies (/v1/chat/completions, /v1/completions) -> a validated generation request.
//
// Every field is type- and range-checked; a bad one is INVALID_ARGUMENT naming it first
// ("top_p: must be in [0, 1]"), an unknown model NOT_FOUND ("model: ..."). Nothing here throws.
//
// Accepted fields. Both endpoints: model (required, must be the served id), max_tokens (and
// max_completion_tokens for chat), temperature, top_p, top_k, min_p, presence_penalty,
// frequency_penalty, seed, stop (a string or up to 4), n (only 1), stream, stream_options
// {include_usage}, user (ignored), ignore_eos (vLLM extension). Chat: messages, tools,
// tool_choice, response_format, parallel_tool_calls, tool_decoding_assistance (the constraints:
// server/openai_grammar.h), thinking, reasoning_effort, logprobs (bool), top_logprobs (0..20).
// Completions: prompt (a string, token ids, or a one-element list of either), logprobs (int 0..5),
// echo (false only), suffix (absent only), best_of (1 only).
//
// Defaults: temperature omitted is greedy (serving/sampling.h); max_tokens omitted is the server's
// max_output_tokens clipped to what fits the context.
//
// Threading: pure functions; the tokenizer is used read-only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serving/request.h"
#include "text/chat_tokens.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

namespace ds41rt::server {

struct api_context {
    const text::tokenizer *tok = nullptr;
    text::chat_encoding encoding = text::chat_encoding::DSV41;
    std::string model_id;
    int64_t max_context = 0;
    int32_t max_output_tokens = 4096;
    // Compiles response_format / tool-call constraints (server/openai_grammar.h). Null: requests
    // that need one are NOT_SUPPORTED.
    text::grammar_compiler *grammars = nullptr;
};

struct api_request {
    bool chat = true;
    serving::generation_request gen;      // on_event left empty
    bool stream = false;
    bool include_usage = false;
    bool starts_in_reasoning = false;     // chat: the prompt ended inside <think>
    int32_t completion_logprobs = -1;     // completions: the legacy int, -1 when absent
};

Result<api_request> parse_chat_completion(const nlohmann::ordered_json &body, const api_context &ctx);
Result<api_request> parse_completion(const nlohmann::ordered_json &body, const api_context &ctx);

}  // namespace ds41rt::server
