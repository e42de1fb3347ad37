// output_parser: a byte-fed state machine over model output (see output_parser.h).
//
// Layers, in the order a byte meets them: (1) UTF-8 assembly, so everything after it works on
// complete characters and nothing emitted can end inside one; (2) EOS detection, which truncates
// the text and turns the pass into a final one; (3) the reasoning / content states, which emit
// eagerly but hold back any tail that could still become a marker (every marker starts with the
// ASCII '<', so a held-back tail never splits a character); (4) the tool-call block, which
// consumes structure as it completes and emits each call only when its invoke closes.
#include "text/output_parser.h"

#include <algorithm>
#include <initializer_list>

#include <nlohmann/json.hpp>

#include "text/py_json.h"
#include "text/utf8.h"

namespace ds41rt::text {

namespace {

// Append the complete UTF-8 of tail+bytes to `out` (ill-formed bytes become U+FFFD); a
// character that later bytes may still complete stays in `tail` unless `final`.
void utf8_take(std::string &tail, std::string_view bytes, std::string &out, bool final) {
    std::string s = std::move(tail);
    tail.clear();
    s.append(bytes);
    if (!final) {
        size_t keep = utf8_incomplete_tail(s);
        tail = s.substr(s.size() - keep);
        s.resize(s.size() - keep);
    }
    out += utf8_lossy(s);
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Start of the longest suffix of `s` that is a proper prefix of one of `markers`.
size_t holdback_start(std::string_view s, std::initializer_list<std::string_view> markers) {
    size_t best = s.size();
    for (std::string_view m : markers) {
        for (size_t k = std::min(m.size() - 1, s.size()); k > 0; --k) {
            if (s.substr(s.size() - k) == m.substr(0, k)) {
                best = std::min(best, s.size() - k);
                break;
            }
        }
    }
    return best;
}

enum class lit { MATCH, PARTIAL, NO };

// Does `s` at `pos` start with `l` (PARTIAL: `s` ends first, still agreeing)?
lit match_at(std::string_view s, size_t pos, std::string_view l) {
    size_t avail = s.size() - pos;
    size_t k = std::min(avail, l.size());
    if (s.substr(pos, k) != l.substr(0, k)) return lit::NO;
    return k == l.size() ? lit::MATCH : lit::PARTIAL;
}

enum class head { OK, NEED_MORE, BAD };

// The attributes after "<｜DSML｜invoke" or "<｜DSML｜parameter": name="..." [string="true|false"] '>'.
head parse_head(std::string_view s, size_t pos, bool want_string, std::string &name, bool &is_string,
                size_t &end) {
    constexpr size_t MAX_NAME = 1024;  // a name longer than this is garbage, not a slow name
    size_t j = pos;
    auto skip = [&] {
        while (j < s.size() && is_ws(s[j])) ++j;
    };
    auto expect = [&](std::string_view l) -> head {
        lit m = match_at(s, j, l);
        if (m == lit::NO) return head::BAD;
        if (m == lit::PARTIAL) return head::NEED_MORE;
        j += l.size();
        return head::OK;
    };
    skip();
    if (head h = expect("name=\""); h != head::OK) return h;
    size_t q = s.find('"', j);
    if (q == std::string_view::npos) return s.size() - j > MAX_NAME ? head::BAD : head::NEED_MORE;
    if (q - j > MAX_NAME) return head::BAD;
    name.assign(s.substr(j, q - j));
    j = q + 1;
    if (want_string) {
        skip();
        if (head h = expect("string=\""); h != head::OK) return h;
        lit t = match_at(s, j, "true\"");
        lit f = match_at(s, j, "false\"");
        if (t == lit::MATCH) { is_string = true; j += 5; }
        else if (f == lit::MATCH) { is_string = false; j += 6; }
        else if (t == lit::PARTIAL || f == lit::PARTIAL) return head::NEED_MORE;
        else return head::BAD;
    }
    skip();
    if (j >= s.size()) return head::NEED_MORE;
    if (s[j] != '>') return head::BAD;
    end = j + 1;
    return head::OK;
}

}  // namespace

output_parser::output_parser(chat_encoding enc, output_parser_options opts)
    : enc_(enc), opts_(std::move(opts)) {
    dsml_tag_names t = dsml_tags(enc_);
    std::string d(DSML_TEXT);
    think_close_ = THINK_CLOSE_TEXT;
    calls_open_ = "<" + d + std::string(t.calls) + ">";
    calls_close_ = "</" + d + std::string(t.calls) + ">";
    invoke_open_ = "<" + d + std::string(t.invoke);
    invoke_close_ = "</" + d + std::string(t.invoke) + ">";
    param_open_ = "<" + d + std::string(t.parameter);
    param_close_ = "</" + d + std::string(t.parameter) + ">";
    state_ = opts_.starts_in_reasoning ? state::REASONING : state::CONTENT;
}

void output_parser::emit_text(output_kind kind, std::string_view s, std::vector<output_event> &out) {
    if (s.empty()) return;
    if (!out.empty() && out.back().kind == kind && kind != output_kind::TOOL_CALL) {
        out.back().text.append(s);
        return;
    }
    output_event e;
    e.kind = kind;
    e.text.assign(s);
    out.push_back(std::move(e));
}

void output_parser::consume(size_t n) {
    tool_raw_.append(buf_, 0, n);
    buf_.erase(0, n);
}

void output_parser::tools_fail(const std::string &why) {
    if (tool_error_.empty()) tool_error_ = why;
    // The unparsed part of the block goes back through the content path (which still watches
    // for EOS and holds back a possible partial marker).
    buf_.insert(0, tool_raw_, invoke_raw_start_, std::string::npos);
    tool_raw_.clear();
    invoke_raw_start_ = 0;
    state_ = state::PASSTHROUGH;
}

std::vector<output_event> output_parser::feed(std::string_view bytes) {
    std::vector<output_event> out;
    if (done_) return out;
    size_t old = buf_.size();
    utf8_take(utf8_tail_, bytes, buf_, /*final=*/false);
    // Only the new text (plus a possible marker start before it) can hold a new EOS.
    size_t from = old >= EOS_TEXT.size() ? old - (EOS_TEXT.size() - 1) : 0;
    size_t e = buf_.find(EOS_TEXT, from);
    bool final = e != std::string::npos;
    if (final) {
        buf_.resize(e);
        saw_eos_ = true;
        utf8_tail_.clear();
    }
    process(final, out);
    if (final) done_ = true;
    return out;
}

std::vector<output_event> output_parser::finish() {
    std::vector<output_event> out;
    if (done_) return out;
    utf8_take(utf8_tail_, {}, buf_, /*final=*/true);
    process(/*final=*/true, out);
    done_ = true;
    return out;
}

void output_parser::process(bool final, std::vector<output_event> &out) {
    for (;;) {
        state before = state_;
        if (state_ == state::TOOLS) process_tools(final, out);
        else process_text_state(final, out);
        if (state_ == before) break;
    }
}

void output_parser::process_text_state(bool final, std::vector<output_event> &out) {
    if (state_ == state::CONTENT && skip_leading_ws_) {
        size_t i = 0;
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
        buf_.erase(0, i);
        if (buf_.empty()) return;
        skip_leading_ws_ = false;
    }
    output_kind kind = state_ == state::REASONING ? output_kind::REASONING : output_kind::CONTENT;
    if (state_ == state::REASONING) {
        size_t p = buf_.find(think_close_);
        if (p != std::string::npos) {
            emit_text(kind, std::string_view(buf_).substr(0, p), out);
            buf_.erase(0, p + think_close_.size());
            state_ = state::CONTENT;
            return;
        }
    } else if (state_ == state::CONTENT) {
        size_t p = buf_.find(calls_open_);
        if (p != std::string::npos) {
            size_t q = p;
            while (q > 0 && is_ws(buf_[q - 1])) --q;
            emit_text(kind, std::string_view(buf_).substr(0, q), out);
            tool_raw_ = buf_.substr(q, p + calls_open_.size() - q);
            buf_.erase(0, p + calls_open_.size());
            invoke_raw_start_ = 0;
            tstate_ = tool_state::BETWEEN;
            state_ = state::TOOLS;
            return;
        }
    }
    if (final) {
        emit_text(kind, buf_, out);
        buf_.clear();
        return;
    }
    size_t h;
    if (state_ == state::REASONING) h = holdback_start(buf_, {think_close_, EOS_TEXT});
    else if (state_ == state::CONTENT) h = holdback_start(buf_, {calls_open_, EOS_TEXT});
    else h = holdback_start(buf_, {EOS_TEXT});
    // Whitespace right before a tool-call block is not content: hold it until the next
    // non-space text decides.
    if (state_ == state::CONTENT)
        while (h > 0 && is_ws(buf_[h - 1])) --h;
    emit_text(kind, std::string_view(buf_).substr(0, h), out);
    buf_.erase(0, h);
}

void output_parser::process_tools(bool final, std::vector<output_event> &out) {
    for (;;) {
        if (tstate_ == tool_state::IN_VALUE) {
            size_t p = buf_.find(param_close_, value_search_from_);
            if (p == std::string::npos) {
                value_search_from_ = buf_.size() >= param_close_.size() ? buf_.size() - (param_close_.size() - 1) : 0;
                if (final) tools_fail("output ended inside the value of parameter '" + param_name_ + "'");
                return;
            }
            std::string_view value = std::string_view(buf_).substr(0, p);
            call_args_ += call_args_.empty() ? "{" : ", ";
            py_json_append_string(call_args_, param_name_);
            call_args_ += ": ";
            if (param_is_string_) {
                py_json_append_string(call_args_, value);
            } else {
                nlohmann::ordered_json v = nlohmann::ordered_json::parse(value, nullptr, false);
                if (v.is_discarded()) {
                    notes_.push_back("tool call " + std::to_string(n_calls_) + " parameter '" + param_name_ +
                                     "': string=\"false\" value is not JSON; passed as a string");
                    py_json_append_string(call_args_, value);
                } else {
                    call_args_ += py_json_dumps(v);
                }
            }
            consume(p + param_close_.size());
            value_search_from_ = 0;
            tstate_ = tool_state::IN_INVOKE;
            continue;
        }

        size_t i = 0;
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
        consume(i);
        const bool between = tstate_ == tool_state::BETWEEN;
        if (buf_.empty()) {
            if (!final) return;
            if (!between) tools_fail("output ended inside the invoke of '" + call_name_ + "'");
            else if (invoke_raw_start_ == 0)  // 0 until this block's first invoke closes
                tools_fail("tool-call block ended before any call");
            // else: complete invokes without the closing tag stand as they are
            return;
        }
        std::string_view close = between ? std::string_view(calls_close_) : std::string_view(invoke_close_);
        std::string_view open = between ? std::string_view(invoke_open_) : std::string_view(param_open_);
        lit mc = match_at(buf_, 0, close);
        lit mo = match_at(buf_, 0, open);
        if (mc == lit::MATCH) {
            consume(close.size());
            if (between) {  // block closed: back to content, dropping the whitespace after it
                tool_raw_.clear();
                invoke_raw_start_ = 0;
                state_ = state::CONTENT;
                skip_leading_ws_ = true;
                return;
            }
            output_event e;
            e.kind = output_kind::TOOL_CALL;
            e.tool_call.index = n_calls_;
            e.tool_call.id = opts_.call_id_prefix + std::to_string(n_calls_);
            e.tool_call.name = call_name_;
            e.tool_call.arguments = call_args_.empty() ? "{}" : call_args_ + "}";
            out.push_back(std::move(e));
            ++n_calls_;
            invoke_raw_start_ = tool_raw_.size();
            tstate_ = tool_state::BETWEEN;
            continue;
        }
        if (mo == lit::MATCH) {
            std::string name;
            bool is_string = true;
            size_t end = 0;
            head h = parse_head(buf_, open.size(), !between, name, is_string, end);
            if (h == head::NEED_MORE) {
                if (final) tools_fail("output ended inside a tool-call tag");
                return;
            }
            if (h == head::BAD) {
                tools_fail(std::string("malformed ") + (between ? "invoke" : "parameter") + " tag");
                return;
            }
            consume(end);
            if (between) {
                call_name_ = name;
                call_args_.clear();
                param_names_.clear();
                tstate_ = tool_state::IN_INVOKE;
            } else {
                if (std::find(param_names_.begin(), param_names_.end(), name) != param_names_.end()) {
                    tools_fail("duplicate parameter '" + name + "' in the invoke of '" + call_name_ + "'");
                    return;
                }
                param_names_.push_back(name);
                param_name_ = name;
                param_is_string_ = is_string;
                value_search_from_ = 0;
                tstate_ = tool_state::IN_VALUE;
            }
            continue;
        }
        // A partial tag, or the start of an EOS text that the next bytes complete, decides nothing yet.
        if (mc == lit::PARTIAL || mo == lit::PARTIAL || match_at(buf_, 0, EOS_TEXT) == lit::PARTIAL) {
            if (final) tools_fail("output ended inside a tool-call tag");
            return;
        }
        tools_fail(between ? "unexpected text between tool calls" : "unexpected text inside the invoke of '" + call_name_ + "'");
        return;
    }
}

std::vector<output_event> coalesce_events(const std::vector<output_event> &events) {
    std::vector<output_event> out;
    for (const output_event &e : events) {
        if (e.kind != output_kind::TOOL_CALL && !out.empty() && out.back().kind == e.kind) {
            out.back().text += e.text;
            continue;
        }
        if (e.kind != output_kind::TOOL_CALL && e.text.empty()) continue;
        out.push_back(e);
    }
    return out;
}

}  // namespace ds41rt::text
