// render_chat: the official DeepSeek prompt encoders (encoding_dsv4 / encoding_dsv41) in C++.
//
// The order of work follows the reference encoders, because each step changes what the next one
// sees: (1) tool messages are folded into user turns as <tool_result> blocks, (2) those blocks are
// sorted by the order of the calls they answer, (3) with thinking on and drop_thinking in force,
// turns before the last user turn lose their reasoning (developer turns there disappear), and
// only then (4) each turn is rendered, with "last user turn" recomputed on the reduced list.
// Every byte of fixed text below (tools block, effort lines, response-format block) is prompt
// format the model was trained on; the golden tests compare it against the official outputs.
#include "text/chat_encoding.h"

#include <algorithm>
#include <unordered_map>

#include "text/py_json.h"

namespace ds41rt::text {

const char *chat_encoding_name(chat_encoding e) {
    return e == chat_encoding::DSV4 ? "encoding_dsv4" : "encoding_dsv41";
}

const char *chat_role_name(chat_role r) {
    switch (r) {
    case chat_role::SYSTEM: return "system";
    case chat_role::DEVELOPER: return "developer";
    case chat_role::USER: return "user";
    case chat_role::ASSISTANT: return "assistant";
    case chat_role::TOOL: return "tool";
    case chat_role::LATEST_REMINDER: return "latest_reminder";
    }
    return "unknown";
}

int32_t v41_effort_budget(const reasoning_effort &e) {
    switch (e.level) {
    case effort_level::DEFAULT:
    case effort_level::HIGH: return 75;
    case effort_level::LOW: return 50;
    case effort_level::MAX: return 100;
    case effort_level::BUDGET: return e.budget >= 1 && e.budget <= 100 ? e.budget : 0;
    }
    return 0;
}

namespace {

// V4's only effort text: prepended before the first message in thinking mode at effort "max".
constexpr std::string_view V4_EFFORT_MAX_TEXT =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

std::string_view task_text(chat_task t) {
    switch (t) {
    case chat_task::NONE: return "";
    case chat_task::ACTION: return "<｜action｜>";
    case chat_task::QUERY: return "<｜query｜>";
    case chat_task::AUTHORITY: return "<｜authority｜>";
    case chat_task::DOMAIN: return "<｜domain｜>";
    case chat_task::TITLE: return "<｜title｜>";
    case chat_task::READ_URL: return "<｜read_url｜>";
    }
    return "";
}

std::string dsml_open(std::string_view tag) {
    std::string s("<");
    s.append(DSML_TEXT).append(tag);
    return s;
}
std::string dsml_close(std::string_view tag) {
    std::string s("</");
    s.append(DSML_TEXT).append(tag).append(">");
    return s;
}

// The "## Tools" block appended (after "\n\n") to the system or developer text that declares tools.
std::string render_tools_block(const std::vector<nlohmann::ordered_json> &tools, chat_encoding enc) {
    dsml_tag_names t = dsml_tags(enc);
    std::string calls_open = dsml_open(t.calls) + ">";
    std::string s;
    s += "## Tools\n\n";
    s += "You have access to a set of tools to help answer the user's question. You can invoke "
         "tools by writing a \"" + calls_open + "\" block like the following:\n\n";
    s += calls_open + "\n";
    s += dsml_open(t.invoke) + " name=\"$TOOL_NAME\">\n";
    s += dsml_open(t.parameter) + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE" +
         dsml_close(t.parameter) + "\n";
    s += "...\n";
    s += dsml_close(t.invoke) + "\n";
    s += dsml_open(t.invoke) + " name=\"$TOOL_NAME2\">\n";
    s += "...\n";
    s += dsml_close(t.invoke) + "\n";
    s += dsml_close(t.calls) + "\n\n";
    s += "String parameters should be specified as is and set `string=\"true\"`. For all other "
         "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
         "`string=\"false\"`.\n\n";
    s += "If thinking_mode is enabled (triggered by <think>), you MUST output your complete "
         "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n";
    s += "Otherwise, output directly after </think> with tool calls or final response.\n\n";
    s += "### Available Tool Schemas\n\n";
    for (size_t i = 0; i < tools.size(); ++i) {
        if (i) s += "\n";
        s += py_json_dumps(tools[i]);
    }
    s += "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
         "tool calls.\n";
    return s;
}

std::string render_response_format(const nlohmann::ordered_json &rf) {
    return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
           py_json_dumps(rf);
}

// "\n\n<｜DSML｜calls>\n<invoke ...>\n<parameter ...>v</parameter>\n</invoke>\n</calls>"
std::string render_tool_calls(const std::vector<chat_tool_call> &calls, chat_encoding enc) {
    dsml_tag_names t = dsml_tags(enc);
    std::string s = "\n\n" + dsml_open(t.calls) + ">\n";
    for (size_t i = 0; i < calls.size(); ++i) {
        if (i) s += "\n";
        s += dsml_open(t.invoke) + " name=\"" + calls[i].name + "\">\n";
        bool first = true;
        for (auto it = calls[i].arguments.begin(); it != calls[i].arguments.end(); ++it) {
            if (!first) s += "\n";
            first = false;
            bool is_str = it.value().is_string();
            s += dsml_open(t.parameter) + " name=\"" + it.key() + "\" string=\"" +
                 (is_str ? "true" : "false") + "\">";
            s += is_str ? it.value().get<std::string>() : py_json_dumps(it.value());
            s += dsml_close(t.parameter);
        }
        s += "\n";
        s += dsml_close(t.invoke);
    }
    s += "\n";
    s += dsml_close(t.calls);
    return s;
}

// A user turn after tool messages are folded in: text and tool-result blocks joined by "\n\n".
struct user_block {
    bool tool_result = false;
    std::string text;
    std::string tool_call_id;
};

// One turn as the renderer sees it (steps 1-3 of the file comment already applied).
struct turn {
    chat_role role = chat_role::USER;  // never TOOL
    const chat_message *msg = nullptr; // source message (nullptr for a user turn made of tool results)
    std::vector<user_block> blocks;    // USER only
    chat_task task = chat_task::NONE;
    bool drop_reasoning = false;       // ASSISTANT before the last user turn, under drop_thinking
};

bool is_user_like(const std::vector<turn> &turns, size_t i, chat_encoding enc) {
    chat_role r = turns[i].role;
    // V4.1 counts a mid-conversation system message as a user turn (spec §9.2 item 1). The
    // developer role is kept user-like in V4.1 as in V4 and in the V4.1 pre-release encoder
    // (the released encoding.py has no developer branch at all).
    return r == chat_role::USER || r == chat_role::DEVELOPER ||
           (enc == chat_encoding::DSV41 && r == chat_role::SYSTEM && i > 0);
}

long last_user_index(const std::vector<turn> &turns, chat_encoding enc) {
    for (size_t i = turns.size(); i-- > 0;)
        if (is_user_like(turns, i, enc)) return static_cast<long>(i);
    return -1;
}

Status invalid(size_t i, const std::string &what) {
    return Status::invalid_argument("messages[" + std::to_string(i) + "]: " + what);
}

}  // namespace

// Checks the message list for shapes the encoders cannot render or that no client should send.
Status validate_chat_request(const chat_request &req, chat_encoding enc) {
    if (req.effort.level == effort_level::BUDGET) {
        if (enc == chat_encoding::DSV4)
            return Status::invalid_argument(
                "reasoning_effort: an integer budget needs the V4.1 encoding; V4 accepts low, high, max");
        if (req.effort.budget < 1 || req.effort.budget > 100)
            return Status::invalid_argument("reasoning_effort: integer budget " +
                                            std::to_string(req.effort.budget) + " is outside 1..100");
    }
    const chat_message *answered = nullptr;  // the assistant turn the current tool messages answer
    size_t n_results = 0;
    std::vector<std::string> seen_ids;
    for (size_t i = 0; i < req.messages.size(); ++i) {
        const chat_message &m = req.messages[i];
        if ((!m.tools.empty() || m.response_format) && m.role != chat_role::SYSTEM &&
            m.role != chat_role::DEVELOPER)
            return invalid(i, std::string("tools and response_format belong on a system or developer "
                                          "message, not ") + chat_role_name(m.role));
        if (m.role == chat_role::DEVELOPER && m.content.empty())
            return invalid(i, "a developer message needs content");
        if (m.no_eos && (m.role != chat_role::ASSISTANT || i + 1 != req.messages.size()))
            return invalid(i, "only the final assistant message can be a prefix to continue");
        if (m.task != chat_task::NONE &&
            (m.role == chat_role::TOOL || m.role == chat_role::LATEST_REMINDER))
            return invalid(i, std::string("a task cannot sit on a ") + chat_role_name(m.role) + " message");
        if (m.role == chat_role::ASSISTANT) {
            answered = m.tool_calls.empty() ? nullptr : &m;
            n_results = 0;
            seen_ids.clear();
            for (const chat_tool_call &c : m.tool_calls) {
                if (c.name.empty()) return invalid(i, "a tool call needs a function name");
                if (!c.arguments.is_object()) return invalid(i, "tool call arguments must be a JSON object");
            }
            continue;
        }
        if (m.role != chat_role::TOOL) {
            answered = nullptr;
            continue;
        }
        if (!answered)
            return invalid(i, "tool message does not follow an assistant message with tool_calls");
        if (++n_results > answered->tool_calls.size())
            return invalid(i, "more tool results than tool calls in the assistant message they answer");
        bool calls_have_ids = std::any_of(answered->tool_calls.begin(), answered->tool_calls.end(),
                                          [](const chat_tool_call &c) { return !c.id.empty(); });
        if (!calls_have_ids) continue;  // positional answers, as in DeepSeek's own examples
        if (m.tool_call_id.empty()) return invalid(i, "tool message needs a tool_call_id");
        bool match = std::any_of(answered->tool_calls.begin(), answered->tool_calls.end(),
                                 [&](const chat_tool_call &c) { return c.id == m.tool_call_id; });
        if (!match) return invalid(i, "tool_call_id '" + m.tool_call_id + "' matches no call of the preceding assistant message");
        if (std::find(seen_ids.begin(), seen_ids.end(), m.tool_call_id) != seen_ids.end())
            return invalid(i, "tool_call_id '" + m.tool_call_id + "' is answered twice");
        seen_ids.push_back(m.tool_call_id);
    }
    return Status::ok();
}

namespace {

// Step 1: tool messages become <tool_result> blocks of a user turn; a user message right after
// a user turn (one without a task) joins it as another block, as in the reference encoders.
std::vector<turn> merge_tool_messages(const std::vector<chat_message> &msgs) {
    std::vector<turn> out;
    for (const chat_message &m : msgs) {
        bool joinable = !out.empty() && out.back().role == chat_role::USER;
        if (m.role == chat_role::TOOL) {
            user_block b{true, m.content, m.tool_call_id};
            if (joinable) {
                out.back().blocks.push_back(std::move(b));
            } else {
                turn t;
                t.blocks.push_back(std::move(b));
                out.push_back(std::move(t));
            }
        } else if (m.role == chat_role::USER) {
            user_block b{false, m.content, {}};
            if (joinable && out.back().task == chat_task::NONE) {
                out.back().blocks.push_back(std::move(b));
                // The reference drops the joining message's task; keeping it is the only reading
                // under which a task on that message means anything.
                out.back().task = m.task;
                if (!out.back().msg) out.back().msg = &m;
            } else {
                turn t;
                t.msg = &m;
                t.task = m.task;
                t.blocks.push_back(std::move(b));
                out.push_back(std::move(t));
            }
        } else {
            turn t;
            t.role = m.role;
            t.msg = &m;
            t.task = m.task;
            out.push_back(std::move(t));
        }
    }
    return out;
}

// Step 2: within each user turn, tool results follow the order of the calls of the latest
// assistant turn with tool calls (unknown ids sort as position 0; the sort is stable).
void sort_tool_results(std::vector<turn> &turns) {
    std::unordered_map<std::string, size_t> order;
    for (turn &t : turns) {
        if (t.role == chat_role::ASSISTANT && !t.msg->tool_calls.empty()) {
            order.clear();
            for (size_t k = 0; k < t.msg->tool_calls.size(); ++k)
                if (!t.msg->tool_calls[k].id.empty()) order[t.msg->tool_calls[k].id] = k;
            continue;
        }
        if (t.role != chat_role::USER || order.empty()) continue;
        std::vector<user_block> results;
        for (const user_block &b : t.blocks)
            if (b.tool_result) results.push_back(b);
        if (results.size() < 2) continue;
        auto key = [&](const user_block &b) {
            auto it = order.find(b.tool_call_id);
            return it == order.end() ? size_t{0} : it->second;
        };
        std::stable_sort(results.begin(), results.end(),
                         [&](const user_block &a, const user_block &b) { return key(a) < key(b); });
        size_t next = 0;
        for (user_block &b : t.blocks)
            if (b.tool_result) b = results[next++];
    }
}

// Step 3: reasoning before the last user turn is dropped; so are developer turns there.
std::vector<turn> drop_thinking(std::vector<turn> turns, chat_encoding enc) {
    long last_user = last_user_index(turns, enc);
    std::vector<turn> out;
    for (size_t i = 0; i < turns.size(); ++i) {
        turn &t = turns[i];
        bool keep_role = t.role == chat_role::USER || t.role == chat_role::SYSTEM ||
                         t.role == chat_role::LATEST_REMINDER;
        if (keep_role || static_cast<long>(i) >= last_user) {
            out.push_back(std::move(t));
        } else if (t.role == chat_role::ASSISTANT) {
            t.drop_reasoning = true;
            out.push_back(std::move(t));
        }
    }
    return out;
}

}  // namespace

Result<rendered_prompt> render_chat(const chat_request &req, chat_encoding enc) {
    DS41RT_RETURN_IF_ERROR(validate_chat_request(req, enc));
    const bool thinking = req.thinking == thinking_mode::THINKING;

    std::vector<turn> turns = merge_tool_messages(req.messages);
    sort_tool_results(turns);
    bool drop = req.drop_thinking;
    for (const turn &t : turns)
        if (t.msg && !t.msg->tools.empty()) drop = false;
    if (thinking && drop) turns = drop_thinking(std::move(turns), enc);
    const long last_user = last_user_index(turns, enc);

    std::string p(BOS_TEXT);
    for (size_t i = 0; i < turns.size(); ++i) {
        const turn &t = turns[i];
        const chat_message *m = t.msg;

        // Effort text and the leading system token belong to the first rendered turn.
        if (i == 0 && enc == chat_encoding::DSV4) {
            if (thinking && req.effort.level == effort_level::MAX) p += V4_EFFORT_MAX_TEXT;
        } else if (i == 0) {
            if (thinking || t.role == chat_role::SYSTEM) p += SYSTEM_TEXT;
            if (thinking)
                p += "Reasoning Effort: " + std::to_string(v41_effort_budget(req.effort)) +
                     " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
        }

        switch (t.role) {
        case chat_role::SYSTEM:
        case chat_role::DEVELOPER:
            if (t.role == chat_role::DEVELOPER) p += USER_TEXT;
            else if (enc == chat_encoding::DSV41 && i > 0) p += SYSTEM_TEXT;
            p += m->content;
            if (!m->tools.empty()) p += "\n\n" + render_tools_block(m->tools, enc);
            if (m->response_format) p += "\n\n" + render_response_format(*m->response_format);
            break;
        case chat_role::USER:
            p += USER_TEXT;
            for (size_t b = 0; b < t.blocks.size(); ++b) {
                if (b) p += "\n\n";
                if (t.blocks[b].tool_result) p += "<tool_result>" + t.blocks[b].text + "</tool_result>";
                else p += t.blocks[b].text;
            }
            break;
        case chat_role::LATEST_REMINDER:
            p += LATEST_REMINDER_TEXT;
            p += m->content;
            break;
        case chat_role::ASSISTANT: {
            // A turn answering a quick-instruction task never has a thinking part.
            bool after_task = i > 0 && turns[i - 1].task != chat_task::NONE;
            bool keep_reasoning = !drop || static_cast<long>(i) > last_user;
            if (thinking && !after_task && keep_reasoning && !t.drop_reasoning) {
                p += m->reasoning_content;
                p += THINK_CLOSE_TEXT;
            }
            p += m->content;
            if (!m->tool_calls.empty()) p += render_tool_calls(m->tool_calls, enc);
            if (!m->no_eos) p += EOS_TEXT;
            break;
        }
        case chat_role::TOOL: break;  // folded into user turns above
        }

        // What follows a turn depends on the next one: only before an assistant turn, a latest
        // reminder, or at the end does a task token or the assistant header appear.
        if (i + 1 < turns.size() && turns[i + 1].role != chat_role::ASSISTANT &&
            turns[i + 1].role != chat_role::LATEST_REMINDER)
            continue;
        if (t.task != chat_task::NONE) {
            if (t.task == chat_task::ACTION) {
                p += ASSISTANT_TEXT;
                p += thinking ? THINK_OPEN_TEXT : THINK_CLOSE_TEXT;
            }
            p += task_text(t.task);
        } else if (is_user_like(turns, i, enc)) {
            p += ASSISTANT_TEXT;
            bool open = thinking && (!drop || static_cast<long>(i) >= last_user);
            p += open ? THINK_OPEN_TEXT : THINK_CLOSE_TEXT;
        }
    }

    rendered_prompt out;
    out.starts_in_reasoning =
        p.size() >= THINK_OPEN_TEXT.size() &&
        std::string_view(p).substr(p.size() - THINK_OPEN_TEXT.size()) == THINK_OPEN_TEXT;
    out.text = std::move(p);
    return out;
}

}  // namespace ds41rt::text
