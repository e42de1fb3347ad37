// The DSML tool-call structural tag (see tool_grammar.h for the shape and the modes).
#include "text/tool_grammar.h"

namespace ds41rt::text {

namespace {

using json = nlohmann::ordered_json;

std::string dsml(std::string_view open, std::string_view tag) {
    std::string s(open);
    s.append(DSML_TEXT).append(tag);
    return s;
}

json const_string(const std::string &v) { return {{"type", "const_string"}, {"value", v}}; }

json any_text(const std::vector<std::string> &excludes) { return {{"type", "any_text"}, {"excludes", excludes}}; }

// The arguments schema the grammar enforces for one function object.
json arguments_schema(const json &fn) {
    auto strict = fn.find("strict");
    if (strict != fn.end() && strict->is_boolean() && !strict->get<bool>()) return true;
    auto params = fn.find("parameters");
    if (params == fn.end() || params->is_null()) return true;
    return *params;
}

}  // namespace

Result<std::string> tool_call_structural_tag(const tool_grammar_request &req) {
    const dsml_tag_names t = dsml_tags(req.encoding);
    const std::string calls_trigger = dsml("<", t.calls) + ">";
    const std::string calls_begin = calls_trigger + "\n";
    const std::string calls_end = dsml("</", t.calls) + ">";
    const std::string invoke_prefix = dsml("<", t.invoke) + " name=\"";
    // Every invoke ends with "\n": the encoder's "\n" between invokes and the one before the
    // calls close tag are both this newline.
    const std::string invoke_end = dsml("</", t.invoke) + ">\n";
    const std::string xml_style = req.encoding == chat_encoding::DSV4 ? "deepseek_xml" : "deepseek_v4_1_xml";
    const std::vector<std::string> think_tags = {std::string(THINK_OPEN_TEXT), std::string(THINK_CLOSE_TEXT)};

    json tags = json::array();
    bool named_found = false;
    for (size_t i = 0; i < req.functions.size(); i++) {
        const json &fn = req.functions[i];
        const std::string path = "tools[" + std::to_string(i) + "].function";
        auto name = fn.find("name");
        if (name == fn.end() || !name->is_string() || name->get<std::string>().empty())
            return Status::invalid_argument(path + ".name: required (a non-empty string)");
        const std::string n = name->get<std::string>();
        if (n.find('"') != std::string::npos || n.find('<') != std::string::npos)
            return Status::invalid_argument(path + ".name: must not contain '\"' or '<'");
        if (req.mode == tool_choice_mode::NAMED) {
            if (n != req.named) continue;
            named_found = true;
        }
        tags.push_back({{"type", "tag"},
                        {"begin", invoke_prefix + n + "\">\n"},
                        {"content", {{"type", "json_schema"}, {"json_schema", arguments_schema(fn)}, {"style", xml_style},
                                     {"max_whitespace_cnt", 1}}},
                        {"end", invoke_end}});
    }
    if (req.mode == tool_choice_mode::NAMED && !named_found)
        return Status::invalid_argument("tool_choice.function.name: no tool named '" + req.named + "' was offered");
    if ((req.mode == tool_choice_mode::REQUIRED || req.mode == tool_choice_mode::AUTO) && tags.empty())
        return Status::invalid_argument("tools: tool_choice needs at least one tool");

    const bool one = req.mode == tool_choice_mode::NAMED || !req.parallel_tool_calls;
    json invokes = {{"type", "tags_with_separator"}, {"tags", tags}, {"separator", ""}, {"at_least_one", true},
                    {"stop_after_first", one}};
    json body;
    switch (req.mode) {
    case tool_choice_mode::NONE: {
        std::vector<std::string> ex = think_tags;
        ex.push_back(calls_trigger);
        body = any_text(ex);
        break;
    }
    case tool_choice_mode::AUTO:
        body = {{"type", "triggered_tags"},
                {"triggers", json::array({calls_trigger})},
                {"tags", json::array({json{{"type", "tag"}, {"begin", calls_begin}, {"content", invokes}, {"end", calls_end}}})},
                {"excludes", think_tags},
                {"stop_after_first", true}};
        break;
    case tool_choice_mode::REQUIRED:
    case tool_choice_mode::NAMED:
        body = {{"type", "sequence"},
                {"elements", json::array({const_string("\n\n" + calls_begin), invokes, const_string(calls_end)})}};
        break;
    }
    json format = body;
    if (req.starts_in_reasoning) {
        json reasoning = {{"type", "tag"}, {"begin", ""}, {"content", any_text(think_tags)}, {"end", std::string(THINK_CLOSE_TEXT)}};
        format = {{"type", "sequence"}, {"elements", json::array({reasoning, body})}};
    }
    json tag = {{"type", "structural_tag"}, {"format", format}};
    return tag.dump();
}

std::string reasoning_then_json_tag(const nlohmann::ordered_json &schema) {
    const std::vector<std::string> think_tags = {std::string(THINK_OPEN_TEXT), std::string(THINK_CLOSE_TEXT)};
    json reasoning = {{"type", "tag"}, {"begin", ""}, {"content", any_text(think_tags)}, {"end", std::string(THINK_CLOSE_TEXT)}};
    json value = {{"type", "json_schema"}, {"json_schema", schema}, {"max_whitespace_cnt", 1}};
    json tag = {{"type", "structural_tag"}, {"format", {{"type", "sequence"}, {"elements", json::array({reasoning, value})}}}};
    return tag.dump();
}

}  // namespace ds41rt::text
