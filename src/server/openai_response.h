// OpenAI response bodies built from a request's generation events: the streamed chunks
// (chat.completion.chunk / text_completion) and the whole response (chat.completion /
// text_completion).
//
// Chat output goes through text::output_parser, so reasoning ("reasoning_content"), content and
// DSML tool calls ("tool_calls", finish_reason "tool_calls") are separated the same way streamed
// or whole. Logprobs are attached to the next chunk that carries output (text held back by the
// parser or a stop string carries its logprobs forward), and whatever is left rides on the finish
// chunk. With stream_options.include_usage every chunk has "usage": null and one last chunk has
// "choices": [] and the usage.
//
// Threading: one builder per request, used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serving/request.h"
#include "server/openai_request.h"
#include "text/output_parser.h"

namespace ds41rt::server {

class response_builder {
public:
    response_builder(const api_request &req, const api_context &ctx, std::string id, int64_t created);

    // Streaming: the chunks to send before any event (chat: the assistant role chunk).
    std::vector<nlohmann::json> stream_start();
    // Streaming: the chunks one event produces (finish and usage chunks on the final event).
    std::vector<nlohmann::json> stream_event(const serving::generation_event &ev);

    // Whole response: feed every event, then build.
    void add(const serving::generation_event &ev);
    nlohmann::json whole() const;

private:
    struct delta_piece {
        text::output_kind kind;
        std::string text;
        text::output_tool_call call;
    };
    // Runs the event through the parser (chat) and stores logprobs; returns the output pieces.
    std::vector<delta_piece> consume(const serving::generation_event &ev);
    nlohmann::json chunk_base() const;
    nlohmann::json logprob_entry(int32_t token, const serving::token_logprobs &lp) const;
    nlohmann::json take_chat_logprobs();        // pending -> {"content": [...]} or null
    nlohmann::json completion_logprobs(size_t from, size_t to) const;
    std::string finish_reason_text() const;
    nlohmann::json usage() const;

    const api_context &ctx_;
    bool chat_;
    bool include_usage_;
    bool want_logprobs_;
    std::string id_;
    int64_t created_;
    text::output_parser parser_;

    // Whole-response state.
    std::string content_, reasoning_, text_;
    std::vector<text::output_tool_call> calls_;
    std::vector<int32_t> tokens_;                 // tokens with logprobs, in order
    std::vector<serving::token_logprobs> logprobs_;
    size_t logprobs_sent_ = 0;                    // streaming: entries already attached
    std::vector<size_t> text_offsets_;            // completions: offset of each token's text
    size_t text_len_ = 0;
    serving::finish_reason reason_ = serving::finish_reason::NONE;
    int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
};

}  // namespace ds41rt::server
