// response_format / tools / tool_choice -> the output grammar (see openai_grammar.h).
#include "server/openai_grammar.h"

#include <string>
#include <vector>

#include "text/tool_grammar.h"

namespace ds41rt::server {

namespace {

using ojson = nlohmann::ordered_json;

Status bad(const std::string &field, const std::string &what) { return Status::invalid_argument(field + ": " + what); }

const ojson *field(const ojson &b, const char *key) {
    auto it = b.find(key);
    if (it == b.end() || it->is_null()) return nullptr;
    return &*it;
}

Status read_bool(const ojson &b, const char *key, bool *out) {
    const ojson *v = field(b, key);
    if (!v) return Status::ok();
    if (!v->is_boolean()) return bad(key, std::string("expected a boolean, got ") + v->type_name());
    *out = v->get<bool>();
    return Status::ok();
}

struct tool_choice {
    bool given = false;
    text::tool_choice_mode mode = text::tool_choice_mode::AUTO;
    std::string named;
};

Result<tool_choice> read_tool_choice(const ojson &body) {
    tool_choice c;
    const ojson *tc = field(body, "tool_choice");
    if (!tc) return c;
    c.given = true;
    if (tc->is_string()) {
        const std::string &s = tc->get_ref<const std::string &>();
        if (s == "none") c.mode = text::tool_choice_mode::NONE;
        else if (s == "auto") c.mode = text::tool_choice_mode::AUTO;
        else if (s == "required") c.mode = text::tool_choice_mode::REQUIRED;
        else return bad("tool_choice", "unknown value '" + s + "' (none, auto, required, or {\"type\": \"function\", ...})");
        return c;
    }
    if (!tc->is_object()) return bad("tool_choice", std::string("expected a string or an object, got ") + tc->type_name());
    const ojson *ty = field(*tc, "type");
    if (!ty || !ty->is_string() || ty->get<std::string>() != "function")
        return bad("tool_choice.type", "must be \"function\"");
    const ojson *fn = field(*tc, "function");
    if (!fn || !fn->is_object()) return bad("tool_choice.function", "missing or not an object");
    const ojson *name = field(*fn, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
        return bad("tool_choice.function.name", "missing or not a non-empty string");
    c.mode = text::tool_choice_mode::NAMED;
    c.named = name->get<std::string>();
    return c;
}

}  // namespace

Result<std::shared_ptr<const text::grammar>> chat_grammar(const ojson &body, text::grammar_compiler &compiler,
                                                          text::chat_encoding encoding, bool starts_in_reasoning) {
    std::vector<ojson> functions;
    if (const ojson *tools = field(body, "tools"))
        for (const ojson &t : *tools) functions.push_back(t.at("function"));
    Result<tool_choice> choice = read_tool_choice(body);
    if (!choice) return choice.status();
    bool parallel = true, assistance = true;
    DS41RT_RETURN_IF_ERROR(read_bool(body, "parallel_tool_calls", &parallel));
    DS41RT_RETURN_IF_ERROR(read_bool(body, "tool_decoding_assistance", &assistance));
    const bool forced = choice->mode == text::tool_choice_mode::REQUIRED || choice->mode == text::tool_choice_mode::NAMED;
    if (forced && functions.empty()) return bad("tool_choice", "a required or named tool call needs tools");

    // response_format (already checked for shape by the chat parser).
    std::string rf_kind = "text";
    const ojson *schema = nullptr;
    bool strict = false;
    if (const ojson *rf = field(body, "response_format")) {
        rf_kind = rf->at("type").get<std::string>();
        if (rf_kind == "json_schema") {
            const ojson &js = rf->at("json_schema");
            schema = &js.at("schema");
            DS41RT_RETURN_IF_ERROR(text::check_json_schema_support(*schema, "response_format.json_schema.schema"));
            if (const ojson *st = field(js, "strict")) {
                if (!st->is_boolean()) return bad("response_format.json_schema.strict", "expected a boolean");
                strict = st->get<bool>();
            }
        }
    }
    const bool json_reply = rf_kind == "json_object" || rf_kind == "json_schema";
    if (json_reply && forced) return bad("response_format", "a JSON response_format cannot be combined with a required tool call");

    if (json_reply) {
        static const ojson any_object = {{"type", "object"}};
        const ojson &s = schema ? *schema : any_object;
        if (starts_in_reasoning) return compiler.structural_tag(text::reasoning_then_json_tag(s), "response_format");
        if (!schema) return compiler.json_object();
        return compiler.json_schema(s.dump(), strict);
    }
    if (functions.empty() || (!forced && !assistance)) return std::shared_ptr<const text::grammar>();

    for (size_t i = 0; i < functions.size(); i++)
        if (const ojson *params = field(functions[i], "parameters"))
            DS41RT_RETURN_IF_ERROR(
                text::check_json_schema_support(*params, "tools[" + std::to_string(i) + "].function.parameters"));
    text::tool_grammar_request req;
    req.encoding = encoding;
    req.functions = std::move(functions);
    req.mode = choice->mode;
    req.named = choice->named;
    req.starts_in_reasoning = starts_in_reasoning;
    req.parallel_tool_calls = parallel;
    Result<std::string> tag = text::tool_call_structural_tag(req);
    if (!tag) return tag.status();
    return compiler.structural_tag(*tag);
}

}  // namespace ds41rt::server
