// Output parser: decoded model output, fed incrementally, split into reasoning_content, content
// and tool calls for the OpenAI response (streamed or whole).
//
// Input is bytes in arbitrary chunks: a chunk may end inside a UTF-8 sequence or inside a
// marker ("</think>", "<｜DSML｜ calls>", the EOS text). Output is events carrying only complete
// UTF-8; text that might still turn out to be a marker is held back until it is decided, and the
// concatenated result never depends on where the chunks were cut (tests feed every split).
//
// The grammar is that of the official parsers (parse_message_from_completion_text):
//   [reasoning "</think>"] content ["\n\n" <｜DSML｜calls> invokes </｜DSML｜calls>] [EOS]
// with the V4 tag names "tool_calls"/"invoke"/"parameter" or the V4.1 ones " calls"/" invoke"/
// " parameter". Where the official parser raises on malformed output, this one degrades:
//  - a tool call is emitted whole (name and complete arguments) when its invoke block closes,
//    so a call the client sees is never retracted;
//  - when the tool-call block breaks (unexpected text, duplicate parameter, end of output inside
//    an invoke), everything after the last complete call (from the whitespace before the block
//    if no call was emitted) is emitted as content, tool-call parsing stops for the rest of the
//    output, and tool_call_error() says what broke;
//  - a string="false" value that is not valid JSON becomes a JSON string (noted in
//    tool_call_notes()); text after the closing tag is content again;
//  - whitespace just before the tool-call block is not content.
// EOS is either the literal "<｜end▁of▁sentence｜>" in the text or a finish() call; output after it
// is ignored.
//
// Threading: one parser per sequence, used from one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_tokens.h"

namespace ds41rt::text {

enum class output_kind { REASONING = 0, CONTENT, TOOL_CALL };

struct output_tool_call {
    int32_t index = 0;      // 0, 1, ... in order of appearance (OpenAI tool_calls[].index)
    std::string id;         // call_id_prefix + index
    std::string name;
    std::string arguments;  // a JSON object as text, e.g. {"location": "Beijing", "days": 3}
};

struct output_event {
    output_kind kind = output_kind::CONTENT;
    std::string text;             // REASONING / CONTENT
    output_tool_call tool_call;   // TOOL_CALL
};

struct output_parser_options {
    // The prompt ended with "<think>" (rendered_prompt::starts_in_reasoning): output begins as
    // reasoning and switches to content at "</think>".
    bool starts_in_reasoning = false;
    std::string call_id_prefix = "call_";
};

class output_parser {
public:
    explicit output_parser(chat_encoding enc, output_parser_options opts = {});

    // Feed the next bytes of decoded output; returns the events they completed, in order.
    std::vector<output_event> feed(std::string_view bytes);
    // End of output (EOS token or length limit): flushes everything held back.
    std::vector<output_event> finish();

    bool done() const { return done_; }              // EOS text seen or finish() called
    bool saw_eos_text() const { return saw_eos_; }
    int32_t tool_call_count() const { return n_calls_; }
    const std::string &tool_call_error() const { return tool_error_; }  // empty: none
    const std::vector<std::string> &tool_call_notes() const { return notes_; }

private:
    enum class state { REASONING, CONTENT, TOOLS, PASSTHROUGH };
    enum class tool_state { BETWEEN, IN_INVOKE, IN_VALUE };

    void process(bool final, std::vector<output_event> &out);
    void process_text_state(bool final, std::vector<output_event> &out);
    void process_tools(bool final, std::vector<output_event> &out);
    void tools_fail(const std::string &why);  // hand the unparsed block back to content
    void emit_text(output_kind kind, std::string_view s, std::vector<output_event> &out);
    void consume(size_t n);  // move n bytes of buf_ into the tool block's raw text

    chat_encoding enc_;
    output_parser_options opts_;
    std::string think_close_, calls_open_, calls_close_, invoke_open_, invoke_close_, param_open_,
        param_close_;

    state state_;
    std::string utf8_tail_;  // incomplete UTF-8 sequence carried to the next feed
    std::string buf_;        // decoded text not yet decided
    bool done_ = false, saw_eos_ = false;
    bool skip_leading_ws_ = false;  // content right after a tool-call block

    // Tool-call block: raw text consumed so far (for the fallback), and the call being built.
    tool_state tstate_ = tool_state::BETWEEN;
    std::string tool_raw_;
    size_t invoke_raw_start_ = 0;
    std::string call_name_, call_args_, param_name_;
    bool param_is_string_ = true;
    std::vector<std::string> param_names_;
    size_t value_search_from_ = 0;

    int32_t n_calls_ = 0;
    std::string tool_error_;
    std::vector<std::string> notes_;
};

// Coalesce adjacent REASONING / CONTENT events of the same kind (tests and non-streamed replies).
std::vector<output_event> coalesce_events(const std::vector<output_event> &events);

}  // namespace ds41rt::text
