// OpenAI request parsing and validation (see openai_request.h for the accepted fields).
#include "server/openai_request.h"

#include <cstdio>
#include <limits>
#include <optional>

#include "server/openai_grammar.h"
#include "text/chat_encoding.h"
#include "text/chat_json.h"

namespace ds41rt::server {

namespace {

using ojson = nlohmann::ordered_json;

constexpr size_t MAX_STOP_STRINGS = 4;

Status bad(const std::string &field, const std::string &what) { return Status::invalid_argument(field + ": " + what); }

std::string num(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return buf;
}

const ojson *field(const ojson &b, const char *key) {
    auto it = b.find(key);
    if (it == b.end() || it->is_null()) return nullptr;
    return &*it;
}

Status read_float(const ojson &b, const char *key, float lo, float hi, std::optional<float> *out) {
    const ojson *v = field(b, key);
    if (!v) return Status::ok();
    if (!v->is_number()) return bad(key, std::string("expected a number, got ") + v->type_name());
    double x = v->get<double>();
    if (!(x >= lo && x <= hi))
        return bad(key, "must be in [" + num(lo) + ", " + num(hi) + "], got " + v->dump());
    *out = float(x);
    return Status::ok();
}

Status read_int(const ojson &b, const char *key, int64_t lo, int64_t hi, std::optional<int64_t> *out) {
    const ojson *v = field(b, key);
    if (!v) return Status::ok();
    if (!v->is_number_integer()) return bad(key, std::string("expected an integer, got ") + v->type_name());
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        return bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v->dump());
    int64_t x = v->get<int64_t>();
    if (x < lo || x > hi)
        return bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v->dump());
    *out = x;
    return Status::ok();
}

Status read_bool(const ojson &b, const char *key, bool *out) {
    const ojson *v = field(b, key);
    if (!v) return Status::ok();
    if (!v->is_boolean()) return bad(key, std::string("expected a boolean, got ") + v->type_name());
    *out = v->get<bool>();
    return Status::ok();
}

// Fields both endpoints share; the prompt is read by the caller, max_tokens resolved after it.
Status read_common(const ojson &b, const api_context &ctx, api_request *r, std::optional<int64_t> *max_tokens) {
    if (!b.is_object()) return Status::invalid_argument("the request body must be a JSON object");
    const ojson *model = field(b, "model");
    if (!model) return bad("model", "required");
    if (!model->is_string()) return bad("model", std::string("expected a string, got ") + model->type_name());
    if (model->get<std::string>() != ctx.model_id)
        return Status::not_found("model: the model '" + model->get<std::string>() + "' does not exist; this server serves '" +
                                 ctx.model_id + "'");
    std::optional<int64_t> n;
    DS41RT_RETURN_IF_ERROR(read_int(b, "n", 1, 128, &n));
    if (n && *n != 1) return bad("n", "only n = 1 is supported");
    DS41RT_RETURN_IF_ERROR(read_bool(b, "stream", &r->stream));
    if (const ojson *so = field(b, "stream_options")) {
        if (!so->is_object()) return bad("stream_options", std::string("expected an object, got ") + so->type_name());
        const ojson *iu = field(*so, "include_usage");
        if (iu && !iu->is_boolean()) return bad("stream_options.include_usage", "expected a boolean");
        r->include_usage = iu && iu->get<bool>();
    }
    serving::sampling_params &p = r->gen.sampling;
    DS41RT_RETURN_IF_ERROR(read_float(b, "temperature", 0.0f, 2.0f, &p.temperature));
    std::optional<float> f;
    DS41RT_RETURN_IF_ERROR(read_float(b, "top_p", 0.0f, 1.0f, &f));
    if (f) p.top_p = *f;
    f.reset();
    DS41RT_RETURN_IF_ERROR(read_float(b, "min_p", 0.0f, 1.0f, &f));
    if (f) p.min_p = *f;
    f.reset();
    DS41RT_RETURN_IF_ERROR(read_float(b, "presence_penalty", -2.0f, 2.0f, &f));
    if (f) p.presence_penalty = *f;
    f.reset();
    DS41RT_RETURN_IF_ERROR(read_float(b, "frequency_penalty", -2.0f, 2.0f, &f));
    if (f) p.frequency_penalty = *f;
    std::optional<int64_t> i;
    DS41RT_RETURN_IF_ERROR(read_int(b, "top_k", -1, std::numeric_limits<int32_t>::max(), &i));
    if (i) p.top_k = int32_t(*i);
    if (const ojson *seed = field(b, "seed")) {
        if (!seed->is_number_integer()) return bad("seed", std::string("expected an integer, got ") + seed->type_name());
        // Signed 64-bit, used as its bit pattern (an unsigned value above 2^63 wraps).
        p.seed = seed->is_number_unsigned() ? int64_t(seed->get<uint64_t>()) : seed->get<int64_t>();
    }
    if (const ojson *stop = field(b, "stop")) {
        if (stop->is_string()) {
            r->gen.stop.push_back(stop->get<std::string>());
        } else if (stop->is_array()) {
            if (stop->size() > MAX_STOP_STRINGS) return bad("stop", "at most 4 stop strings");
            for (size_t k = 0; k < stop->size(); k++) {
                if (!(*stop)[k].is_string())
                    return bad("stop[" + std::to_string(k) + "]", std::string("expected a string, got ") + (*stop)[k].type_name());
                r->gen.stop.push_back((*stop)[k].get<std::string>());
            }
        } else {
            return bad("stop", std::string("expected a string or an array of strings, got ") + stop->type_name());
        }
    }
    DS41RT_RETURN_IF_ERROR(read_bool(b, "ignore_eos", &r->gen.ignore_eos));
    const char *mt_key = field(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    DS41RT_RETURN_IF_ERROR(read_int(b, mt_key, 1, std::numeric_limits<int32_t>::max(), max_tokens));
    if (const ojson *u = field(b, "user"); u && !u->is_string()) return bad("user", "expected a string");
    return Status::ok();
}

// Fills prompt-dependent limits: max_tokens omitted -> max_output_tokens clipped to the context.
Status resolve_max_tokens(const api_context &ctx, std::optional<int64_t> max_tokens, api_request *r) {
    const int64_t room = ctx.max_context - int64_t(r->gen.prompt.size());
    if (max_tokens) {
        r->gen.max_tokens = int32_t(*max_tokens);
        return Status::ok();  // prompt + max_tokens over the context: the scheduler says EXCEEDS_CONTEXT
    }
    if (room < 1)
        return Status(status_code::EXCEEDS_CONTEXT, "the prompt has " + std::to_string(r->gen.prompt.size()) +
                                                        " tokens; this model's context is " +
                                                        std::to_string(ctx.max_context));
    r->gen.max_tokens = int32_t(std::min<int64_t>(room, ctx.max_output_tokens));
    return Status::ok();
}

Status read_token_ids(const ojson &arr, const std::string &path, std::vector<int32_t> *out) {
    for (size_t k = 0; k < arr.size(); k++) {
        const ojson &v = arr[k];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
            return bad(path + "[" + std::to_string(k) + "]", "expected a token id (a non-negative integer)");
        out->push_back(int32_t(v.get<int64_t>()));
    }
    return Status::ok();
}

}  // namespace

Result<api_request> parse_chat_completion(const ojson &body, const api_context &ctx) {
    api_request r;
    r.chat = true;
    std::optional<int64_t> max_tokens;
    DS41RT_RETURN_IF_ERROR(read_common(body, ctx, &r, &max_tokens));
    const ojson *msgs = field(body, "messages");
    if (!msgs) return bad("messages", "required");
    if (!msgs->is_array()) return bad("messages", std::string("expected an array, got ") + msgs->type_name());
    if (msgs->empty()) return bad("messages", "must contain at least one message");
    DS41RT_RETURN_IF_ERROR(read_bool(body, "logprobs", &r.gen.sampling.logprobs));
    std::optional<int64_t> tl;
    DS41RT_RETURN_IF_ERROR(read_int(body, "top_logprobs", 0, serving::MAX_TOP_LOGPROBS, &tl));
    if (tl) {
        if (!r.gen.sampling.logprobs && *tl > 0) return bad("top_logprobs", "requires logprobs to be true");
        r.gen.sampling.top_logprobs = int32_t(*tl);
    }
    Result<text::chat_request> chat = text::parse_chat_request(body, ctx.encoding);
    if (!chat) return chat.status();
    Result<text::rendered_prompt> rendered = text::render_chat(*chat, ctx.encoding);
    if (!rendered) return rendered.status();
    r.starts_in_reasoning = rendered->starts_in_reasoning;
    if (ctx.grammars) {
        Result<std::shared_ptr<const text::grammar>> g =
            chat_grammar(body, *ctx.grammars, ctx.encoding, rendered->starts_in_reasoning);
        if (!g) return g.status();
        r.gen.grammar = *g;
    } else {
        const ojson *rf = field(body, "response_format");
        const ojson *tc = field(body, "tool_choice");
        if ((rf && rf->value("type", "") != "text") ||
            (tc && !(tc->is_string() && (*tc == "auto" || *tc == "none"))))
            return Status::not_supported("response_format / tool_choice: this server has no grammar engine");
    }
    r.gen.prompt = ctx.tok->encode(rendered->text, /*allow_special=*/true);
    DS41RT_RETURN_IF_ERROR(resolve_max_tokens(ctx, max_tokens, &r));
    return r;
}

Result<api_request> parse_completion(const ojson &body, const api_context &ctx) {
    api_request r;
    r.chat = false;
    std::optional<int64_t> max_tokens;
    DS41RT_RETURN_IF_ERROR(read_common(body, ctx, &r, &max_tokens));
    std::optional<int64_t> lp;
    DS41RT_RETURN_IF_ERROR(read_int(body, "logprobs", 0, 5, &lp));
    if (lp) {
        r.completion_logprobs = int32_t(*lp);
        r.gen.sampling.logprobs = true;
        r.gen.sampling.top_logprobs = int32_t(*lp);
    }
    bool echo = false;
    DS41RT_RETURN_IF_ERROR(read_bool(body, "echo", &echo));
    if (echo) return bad("echo", "echo is not supported");
    if (field(body, "suffix")) return bad("suffix", "suffix is not supported");
    std::optional<int64_t> best_of;
    DS41RT_RETURN_IF_ERROR(read_int(body, "best_of", 1, 128, &best_of));
    if (best_of && *best_of != 1) return bad("best_of", "only best_of = 1 is supported");

    const ojson *prompt = field(body, "prompt");
    if (!prompt) return bad("prompt", "required");
    const ojson *one = prompt;
    std::string path = "prompt";
    // A list holding one prompt (a string or a list of ids) is that prompt.
    if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
        one = &(*prompt)[0];
        path = "prompt[0]";
    } else if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
        return bad("prompt", "several prompts in one request are not supported; send one per request");
    }
    if (one->is_string()) {
        r.gen.prompt = ctx.tok->encode(one->get<std::string>(), /*allow_special=*/true);
    } else if (one->is_array()) {
        DS41RT_RETURN_IF_ERROR(read_token_ids(*one, path, &r.gen.prompt));
    } else {
        return bad("prompt", std::string("expected a string or an array of token ids, got ") + prompt->type_name());
    }
    if (r.gen.prompt.empty()) return bad("prompt", "empty");
    DS41RT_RETURN_IF_ERROR(resolve_max_tokens(ctx, max_tokens, &r));
    return r;
}

}  // namespace ds41rt::server
