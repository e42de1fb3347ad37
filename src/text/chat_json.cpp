// OpenAI chat JSON -> chat_request: type checks with JSON paths in every error (see chat_json.h).
#include "text/chat_json.h"

#include <cctype>

namespace ds41rt::text {

using ojson = nlohmann::ordered_json;

namespace {

Status bad(const std::string &path, const std::string &what) {
    return Status::invalid_argument(path + ": " + what);
}

const char *type_name(const ojson &v) { return v.type_name(); }

// content: a string, null (-> ""), or an array of {"type": "text", "text": ...} parts joined by
// "\n\n" (the join the reference encoder uses for content blocks).
Status read_content(const ojson &m, const std::string &path, bool required, std::string &out) {
    auto it = m.find("content");
    if (it == m.end() || it->is_null()) {
        if (required) return bad(path + ".content", "missing");
        return Status::ok();
    }
    if (it->is_string()) {
        out = it->get<std::string>();
        return Status::ok();
    }
    if (!it->is_array()) return bad(path + ".content", std::string("expected a string or an array of parts, got ") + type_name(*it));
    for (size_t k = 0; k < it->size(); ++k) {
        const ojson &part = (*it)[k];
        std::string pp = path + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) return bad(pp, "expected an object");
        auto ty = part.find("type");
        if (ty == part.end() || !ty->is_string()) return bad(pp + ".type", "missing or not a string");
        const std::string &t = ty->get_ref<const std::string &>();
        if (t == "image_url" || t == "image" || t == "input_image")
            return Status::not_supported(pp + ": image content is not supported by this server yet");
        if (t != "text") return bad(pp + ".type", "unknown content part type '" + t + "'");
        auto tx = part.find("text");
        if (tx == part.end() || !tx->is_string()) return bad(pp + ".text", "missing or not a string");
        if (k) out += "\n\n";
        out += tx->get<std::string>();
    }
    return Status::ok();
}

Status read_optional_string(const ojson &m, const char *key, const std::string &path, std::string &out) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) return Status::ok();
    if (!it->is_string()) return bad(path + "." + key, std::string("expected a string, got ") + type_name(*it));
    out = it->get<std::string>();
    return Status::ok();
}

// The {"type": "function", "function": {"name": ...}} envelope shared by tools and tool calls:
// returns the function object, or the error naming what is wrong with the envelope.
Result<const ojson *> read_function(const ojson &v, const std::string &path) {
    if (!v.is_object()) return bad(path, "expected an object");
    auto ty = v.find("type");
    if (ty != v.end() && !(ty->is_string() && ty->get<std::string>() == "function"))
        return bad(path + ".type", "only \"function\" is supported");
    auto fn = v.find("function");
    if (fn == v.end() || !fn->is_object()) return bad(path + ".function", "missing or not an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
        return bad(path + ".function.name", "missing or not a non-empty string");
    return &*fn;
}

// tools: [{"type": "function", "function": {"name": ..., ...}}] -> the function objects.
Status read_tools(const ojson &tools, const std::string &path, std::vector<ojson> &out) {
    if (!tools.is_array()) return bad(path, "expected an array");
    for (size_t k = 0; k < tools.size(); ++k) {
        Result<const ojson *> fn = read_function(tools[k], path + "[" + std::to_string(k) + "]");
        if (!fn.is_ok()) return fn.status();
        out.push_back(**fn);
    }
    return Status::ok();
}

Status read_task(const ojson &m, const std::string &path, chat_task &out) {
    auto it = m.find("task");
    if (it == m.end() || it->is_null()) return Status::ok();
    if (!it->is_string()) return bad(path + ".task", "expected a string");
    static const std::pair<const char *, chat_task> names[] = {
        {"action", chat_task::ACTION}, {"query", chat_task::QUERY},   {"authority", chat_task::AUTHORITY},
        {"domain", chat_task::DOMAIN}, {"title", chat_task::TITLE},   {"read_url", chat_task::READ_URL}};
    for (const auto &[n, t] : names)
        if (it->get<std::string>() == n) {
            out = t;
            return Status::ok();
        }
    return bad(path + ".task", "unknown task '" + it->get<std::string>() +
                                   "' (action, query, authority, domain, title, read_url)");
}

Status read_tool_calls(const ojson &m, const std::string &path, std::vector<chat_tool_call> &out) {
    auto it = m.find("tool_calls");
    if (it == m.end() || it->is_null()) return Status::ok();
    if (!it->is_array()) return bad(path + ".tool_calls", "expected an array");
    for (size_t k = 0; k < it->size(); ++k) {
        const ojson &c = (*it)[k];
        std::string cp = path + ".tool_calls[" + std::to_string(k) + "]";
        Result<const ojson *> f = read_function(c, cp);
        if (!f.is_ok()) return f.status();
        const ojson &fn = **f;
        chat_tool_call call;
        DS41RT_RETURN_IF_ERROR(read_optional_string(c, "id", cp, call.id));
        call.name = fn["name"].get<std::string>();
        auto args = fn.find("arguments");
        std::string ap = cp + ".function.arguments";
        if (args == fn.end() || args->is_null()) {
            // no arguments: an empty object
        } else if (args->is_object()) {
            call.arguments = *args;
        } else if (args->is_string()) {
            const std::string &s = args->get_ref<const std::string &>();
            bool blank = true;
            for (unsigned char ch : s) blank = blank && std::isspace(ch);
            if (!blank) {
                ojson parsed = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
                if (parsed.is_discarded()) return bad(ap, "not valid JSON");
                if (!parsed.is_object()) return bad(ap, "must encode a JSON object");
                call.arguments = std::move(parsed);
            }
        } else {
            return bad(ap, std::string("expected a JSON string, got ") + type_name(*args));
        }
        out.push_back(std::move(call));
    }
    return Status::ok();
}

Status read_message(const ojson &m, size_t i, chat_message &out) {
    std::string path = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(path, "expected an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return bad(path + ".role", "missing or not a string");
    const std::string &r = role->get_ref<const std::string &>();
    if (r == "system") out.role = chat_role::SYSTEM;
    else if (r == "developer") out.role = chat_role::DEVELOPER;
    else if (r == "user") out.role = chat_role::USER;
    else if (r == "assistant") out.role = chat_role::ASSISTANT;
    else if (r == "tool") out.role = chat_role::TOOL;
    else if (r == "latest_reminder") out.role = chat_role::LATEST_REMINDER;
    else return bad(path + ".role", "unknown role '" + r + "'");

    bool is_assistant = out.role == chat_role::ASSISTANT;
    DS41RT_RETURN_IF_ERROR(read_content(m, path, !is_assistant, out.content));
    DS41RT_RETURN_IF_ERROR(read_task(m, path, out.task));

    // Fields that only one role may carry: a wrong one is a client bug worth naming.
    auto only = [&](const char *key, bool allowed, const char *who) -> Status {
        auto it = m.find(key);
        if (it != m.end() && !it->is_null() && !allowed)
            return bad(path + "." + key, std::string("only ") + who + " messages may carry it");
        return Status::ok();
    };
    bool sys_or_dev = out.role == chat_role::SYSTEM || out.role == chat_role::DEVELOPER;
    DS41RT_RETURN_IF_ERROR(only("reasoning_content", is_assistant, "assistant"));
    DS41RT_RETURN_IF_ERROR(only("tool_calls", is_assistant, "assistant"));
    DS41RT_RETURN_IF_ERROR(only("prefix", is_assistant, "assistant"));
    DS41RT_RETURN_IF_ERROR(only("tool_call_id", out.role == chat_role::TOOL, "tool"));
    DS41RT_RETURN_IF_ERROR(only("tools", sys_or_dev, "system or developer"));
    DS41RT_RETURN_IF_ERROR(only("response_format", sys_or_dev, "system or developer"));

    if (is_assistant) {
        DS41RT_RETURN_IF_ERROR(read_optional_string(m, "reasoning_content", path, out.reasoning_content));
        DS41RT_RETURN_IF_ERROR(read_tool_calls(m, path, out.tool_calls));
        auto prefix = m.find("prefix");
        if (prefix != m.end() && !prefix->is_null()) {
            if (!prefix->is_boolean()) return bad(path + ".prefix", "expected a boolean");
            out.no_eos = prefix->get<bool>();
        }
    }
    if (out.role == chat_role::TOOL)
        DS41RT_RETURN_IF_ERROR(read_optional_string(m, "tool_call_id", path, out.tool_call_id));
    if (sys_or_dev) {
        auto tools = m.find("tools");
        if (tools != m.end() && !tools->is_null())
            DS41RT_RETURN_IF_ERROR(read_tools(*tools, path + ".tools", out.tools));
        auto rf = m.find("response_format");
        if (rf != m.end() && !rf->is_null()) out.response_format = *rf;
    }
    return Status::ok();
}

// Request-level reasoning switches -> thinking mode and effort.
Status read_reasoning(const ojson &body, chat_request &req) {
    bool disabled = false, enabled = false;
    auto th = body.find("thinking");
    if (th != body.end() && !th->is_null()) {
        if (!th->is_object()) return bad("thinking", "expected an object like {\"type\": \"disabled\"}");
        auto ty = th->find("type");
        if (ty == th->end() || !ty->is_string()) return bad("thinking.type", "missing or not a string");
        const std::string &t = ty->get_ref<const std::string &>();
        if (t == "disabled") disabled = true;
        else if (t == "enabled") enabled = true;
        else return bad("thinking.type", "expected \"enabled\" or \"disabled\", got '" + t + "'");
    }
    bool none = false;
    auto re = body.find("reasoning_effort");
    if (re != body.end() && !re->is_null()) {
        if (re->is_string()) {
            const std::string &e = re->get_ref<const std::string &>();
            if (e == "low") req.effort.level = effort_level::LOW;
            else if (e == "high") req.effort.level = effort_level::HIGH;
            else if (e == "max") req.effort.level = effort_level::MAX;
            else if (e == "none") none = true;
            else return bad("reasoning_effort", "unknown value '" + e + "' (low, high, max, none, or an integer 1..100)");
        } else if (re->is_number_integer()) {
            int64_t b = re->get<int64_t>();
            if (b < 1 || b > 100) return bad("reasoning_effort", "integer budget " + std::to_string(b) + " is outside 1..100");
            req.effort.level = effort_level::BUDGET;
            req.effort.budget = static_cast<int32_t>(b);
        } else {
            return bad("reasoning_effort", std::string("expected a string or an integer, got ") + type_name(*re));
        }
    }
    if (enabled && none) return bad("reasoning_effort", "\"none\" contradicts thinking {type: enabled}");
    req.thinking = (disabled || none) ? thinking_mode::CHAT : thinking_mode::THINKING;
    return Status::ok();
}

// Attach request-level tools / response format to the first system message (inserting an empty
// one at the front when there is none).
chat_message &first_system(std::vector<chat_message> &msgs) {
    for (chat_message &m : msgs)
        if (m.role == chat_role::SYSTEM) return m;
    chat_message sys;
    sys.role = chat_role::SYSTEM;
    msgs.insert(msgs.begin(), std::move(sys));
    return msgs.front();
}

}  // namespace

Result<std::vector<chat_message>> parse_chat_messages(const ojson &messages) {
    if (!messages.is_array()) return bad("messages", "expected an array");
    if (messages.empty()) return bad("messages", "must not be empty");
    std::vector<chat_message> out(messages.size());
    for (size_t i = 0; i < messages.size(); ++i) DS41RT_RETURN_IF_ERROR(read_message(messages[i], i, out[i]));
    return out;
}

Result<chat_request> parse_chat_request(const ojson &body, chat_encoding enc) {
    if (!body.is_object()) return bad("request", "expected a JSON object");
    auto msgs = body.find("messages");
    if (msgs == body.end()) return bad("messages", "missing");
    Result<std::vector<chat_message>> parsed = parse_chat_messages(*msgs);
    if (!parsed.is_ok()) return parsed.status();
    chat_request req;
    req.messages = std::move(parsed).value();
    DS41RT_RETURN_IF_ERROR(read_reasoning(body, req));

    std::vector<ojson> tools;
    auto t = body.find("tools");
    if (t != body.end() && !t->is_null()) DS41RT_RETURN_IF_ERROR(read_tools(*t, "tools", tools));
    if (!tools.empty()) {
        chat_message &sys = first_system(req.messages);
        sys.tools.insert(sys.tools.end(), tools.begin(), tools.end());
    }

    auto rf = body.find("response_format");
    if (rf != body.end() && !rf->is_null()) {
        if (!rf->is_object()) return bad("response_format", "expected an object");
        auto ty = rf->find("type");
        if (ty == rf->end() || !ty->is_string()) return bad("response_format.type", "missing or not a string");
        const std::string &kind = ty->get_ref<const std::string &>();
        if (kind == "json_schema") {
            auto js = rf->find("json_schema");
            if (js == rf->end() || !js->is_object()) return bad("response_format.json_schema", "missing or not an object");
            auto schema = js->find("schema");
            if (schema == js->end() || !schema->is_object())
                return bad("response_format.json_schema.schema", "missing or not an object");
            first_system(req.messages).response_format = *schema;
        } else if (kind != "json_object" && kind != "text") {
            return bad("response_format.type", "unknown type '" + kind + "' (text, json_object, json_schema)");
        }
    }
    DS41RT_RETURN_IF_ERROR(validate_chat_request(req, enc));
    return req;
}

Result<chat_request> parse_chat_request_text(std::string_view body, chat_encoding enc) {
    ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return bad("request", "body is not valid JSON");
    return parse_chat_request(j, enc);
}

}  // namespace ds41rt::text
