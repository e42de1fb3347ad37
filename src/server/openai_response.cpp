// OpenAI response bodies (see openai_response.h).
#include "server/openai_response.h"

#include "text/utf8.h"

namespace ds41rt::server {

using json = nlohmann::json;

response_builder::response_builder(const api_request &req, const api_context &ctx, std::string id, int64_t created)
    : ctx_(ctx),
      chat_(req.chat),
      include_usage_(req.include_usage),
      want_logprobs_(req.gen.sampling.logprobs),
      id_(std::move(id)),
      created_(created),
      parser_(ctx.encoding, text::output_parser_options{req.starts_in_reasoning, "call_"}) {}

json response_builder::chunk_base() const {
    json c;
    c["id"] = id_;
    c["object"] = chat_ ? "chat.completion.chunk" : "text_completion";
    c["created"] = created_;
    c["model"] = ctx_.model_id;
    if (include_usage_) c["usage"] = nullptr;
    return c;
}

json response_builder::logprob_entry(int32_t token, const serving::token_logprobs &lp) const {
    auto one = [&](int32_t id, float logprob) {
        std::string_view raw = ctx_.tok ? ctx_.tok->token_bytes(id) : std::string_view();
        json bytes = json::array();
        for (unsigned char b : raw) bytes.push_back(int(b));
        json e;
        e["token"] = text::utf8_lossy(raw);
        e["logprob"] = logprob;
        e["bytes"] = std::move(bytes);
        return e;
    };
    json e = one(token, lp.logprob);
    json top = json::array();
    for (const auto &t : lp.top) top.push_back(one(t.id, t.logprob));
    e["top_logprobs"] = std::move(top);
    return e;
}

json response_builder::take_chat_logprobs() {
    if (!want_logprobs_) return nullptr;
    json content = json::array();
    for (; logprobs_sent_ < logprobs_.size(); logprobs_sent_++)
        content.push_back(logprob_entry(tokens_[logprobs_sent_], logprobs_[logprobs_sent_]));
    json lp;
    lp["content"] = std::move(content);
    return lp;
}

json response_builder::completion_logprobs(size_t from, size_t to) const {
    if (!want_logprobs_) return nullptr;
    json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
    for (size_t i = from; i < to; i++) {
        std::string_view raw = ctx_.tok ? ctx_.tok->token_bytes(tokens_[i]) : std::string_view();
        tokens.push_back(text::utf8_lossy(raw));
        token_logprobs.push_back(logprobs_[i].logprob);
        json alts = json::object();
        for (const auto &t : logprobs_[i].top) {
            std::string s = text::utf8_lossy(ctx_.tok ? ctx_.tok->token_bytes(t.id) : std::string_view());
            if (!alts.contains(s)) alts[s] = t.logprob;
        }
        top.push_back(std::move(alts));
        offsets.push_back(text_offsets_[i]);
    }
    json lp;
    lp["tokens"] = std::move(tokens);
    lp["token_logprobs"] = std::move(token_logprobs);
    lp["top_logprobs"] = std::move(top);
    lp["text_offset"] = std::move(offsets);
    return lp;
}

std::string response_builder::finish_reason_text() const {
    if (reason_ == serving::finish_reason::LENGTH) return "length";
    if (chat_ && parser_.tool_call_count() > 0) return "tool_calls";
    return "stop";
}

json response_builder::usage() const {
    json u;
    u["prompt_tokens"] = prompt_tokens_;
    u["completion_tokens"] = completion_tokens_;
    u["total_tokens"] = prompt_tokens_ + completion_tokens_;
    // Prompt tokens served from a prefix cache: none yet (every prompt is prefilled), so 0 is the
    // true count, reported in OpenAI's shape so clients that read it need no special case.
    u["prompt_tokens_details"] = {{"cached_tokens", 0}};
    return u;
}

std::vector<response_builder::delta_piece> response_builder::consume(const serving::generation_event &ev) {
    prompt_tokens_ = ev.prompt_tokens;
    completion_tokens_ = ev.completion_tokens;
    if (ev.token >= 0 && want_logprobs_) {
        tokens_.push_back(ev.token);
        logprobs_.push_back(ev.logprobs);
        text_offsets_.push_back(text_len_);
    }
    text_len_ += ev.text.size();
    if (ev.finished) reason_ = ev.reason;
    std::vector<delta_piece> out;
    if (!chat_) {
        if (!ev.text.empty()) out.push_back({text::output_kind::CONTENT, ev.text, {}});
        return out;
    }
    std::vector<text::output_event> evs = parser_.feed(ev.text);
    if (ev.finished) {
        std::vector<text::output_event> tail = parser_.finish();
        evs.insert(evs.end(), tail.begin(), tail.end());
    }
    for (auto &e : text::coalesce_events(evs)) {
        if (e.kind != text::output_kind::TOOL_CALL && e.text.empty()) continue;
        out.push_back({e.kind, std::move(e.text), std::move(e.tool_call)});
    }
    return out;
}

std::vector<json> response_builder::stream_start() {
    std::vector<json> out;
    if (!chat_) return out;
    json c = chunk_base();
    json choice;
    choice["index"] = 0;
    choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    c["choices"] = json::array({choice});
    out.push_back(std::move(c));
    return out;
}

std::vector<json> response_builder::stream_event(const serving::generation_event &ev) {
    std::vector<json> out;
    std::vector<delta_piece> pieces = consume(ev);
    size_t lp_from = logprobs_sent_;
    for (auto &p : pieces) {
        json c = chunk_base();
        json choice;
        choice["index"] = 0;
        if (chat_) {
            json delta = json::object();
            if (p.kind == text::output_kind::CONTENT) delta["content"] = p.text;
            else if (p.kind == text::output_kind::REASONING) delta["reasoning_content"] = p.text;
            else
                delta["tool_calls"] = json::array({{{"index", p.call.index},
                                                     {"id", p.call.id},
                                                     {"type", "function"},
                                                     {"function", {{"name", p.call.name}, {"arguments", p.call.arguments}}}}});
            choice["delta"] = std::move(delta);
            choice["logprobs"] = take_chat_logprobs();
        } else {
            choice["text"] = p.text;
            choice["logprobs"] = completion_logprobs(lp_from, logprobs_.size());
            lp_from = logprobs_sent_ = logprobs_.size();
        }
        choice["finish_reason"] = nullptr;
        c["choices"] = json::array({choice});
        out.push_back(std::move(c));
    }
    if (ev.finished) {
        json c = chunk_base();
        json choice;
        choice["index"] = 0;
        if (chat_) {
            choice["delta"] = json::object();
            choice["logprobs"] = logprobs_sent_ < logprobs_.size() ? take_chat_logprobs() : json(nullptr);
        } else {
            choice["text"] = "";
            choice["logprobs"] = lp_from < logprobs_.size() ? completion_logprobs(lp_from, logprobs_.size()) : json(nullptr);
            logprobs_sent_ = logprobs_.size();
        }
        choice["finish_reason"] = finish_reason_text();
        c["choices"] = json::array({choice});
        out.push_back(std::move(c));
        if (include_usage_) {
            json u = chunk_base();
            u["choices"] = json::array();
            u["usage"] = usage();
            out.push_back(std::move(u));
        }
    }
    return out;
}

void response_builder::add(const serving::generation_event &ev) {
    for (auto &p : consume(ev)) {
        switch (p.kind) {
        case text::output_kind::CONTENT: (chat_ ? content_ : text_) += p.text; break;
        case text::output_kind::REASONING: reasoning_ += p.text; break;
        case text::output_kind::TOOL_CALL: calls_.push_back(std::move(p.call)); break;
        }
    }
}

json response_builder::whole() const {
    json r;
    r["id"] = id_;
    r["object"] = chat_ ? "chat.completion" : "text_completion";
    r["created"] = created_;
    r["model"] = ctx_.model_id;
    json choice;
    choice["index"] = 0;
    if (chat_) {
        json msg;
        msg["role"] = "assistant";
        msg["content"] = content_.empty() && !calls_.empty() ? json(nullptr) : json(content_);
        if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
        if (!calls_.empty()) {
            json calls = json::array();
            for (const auto &c : calls_)
                calls.push_back({{"id", c.id},
                                 {"type", "function"},
                                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
            msg["tool_calls"] = std::move(calls);
        }
        choice["message"] = std::move(msg);
        if (want_logprobs_) {
            json content = json::array();
            for (size_t i = 0; i < logprobs_.size(); i++) content.push_back(logprob_entry(tokens_[i], logprobs_[i]));
            choice["logprobs"] = {{"content", std::move(content)}};
        } else {
            choice["logprobs"] = nullptr;
        }
    } else {
        choice["text"] = text_;
        choice["logprobs"] = completion_logprobs(0, logprobs_.size());
    }
    choice["finish_reason"] = finish_reason_text();
    r["choices"] = json::array({choice});
    r["usage"] = usage();
    return r;
}

}  // namespace ds41rt::server
