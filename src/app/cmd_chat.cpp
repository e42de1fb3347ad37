// ds41rt chat: a terminal client for a running server. Each line read from stdin is a user turn;
// the reply streams from /v1/chat/completions (SSE) as it is generated: reasoning dimmed (or
// marked "[thinking]" when stdout is not a terminal), then the content, then any tool calls.
// The conversation is kept and sent again each turn with earlier reasoning dropped, as DeepSeek's
// multi-turn format wants. "/reset" starts over, "/quit" or end of input ends.
#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "app/commands.h"

namespace ds41rt::app {

namespace {

using nlohmann::json;

struct chat_args {
    std::string url = "http://127.0.0.1:8000";
    std::string api_key;
    std::string model;  // empty: the first model the server lists
    std::string system;
    bool no_thinking = false;
    int max_tokens = 1024;
    std::optional<float> temperature;  // omitted: the server's default (greedy)
};

httplib::Headers headers_of(const chat_args &a) {
    httplib::Headers h;
    if (!a.api_key.empty()) h.emplace("Authorization", "Bearer " + a.api_key);
    return h;
}

// The text of an OpenAI error body, or the body itself.
std::string error_text(int status, const std::string &body) {
    const json j = json::parse(body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message"))
        return "HTTP " + std::to_string(status) + ": " + j["error"]["message"].get<std::string>();
    return "HTTP " + std::to_string(status) + ": " + body;
}

// One turn: streams the reply to stdout, returns the assistant content (empty on failure).
std::optional<std::string> turn(httplib::Client &cli, const chat_args &a, const json &messages, bool tty) {
    json body = {{"model", a.model}, {"messages", messages}, {"stream", true}, {"max_tokens", a.max_tokens}};
    if (a.no_thinking) body["thinking"] = {{"type", "disabled"}};
    if (a.temperature) body["temperature"] = *a.temperature;

    std::string pending, raw, content, error;
    bool in_reasoning = false;
    auto on_event = [&](const std::string &data) {
        if (data == "[DONE]") return;
        const json ev = json::parse(data, nullptr, false);
        if (!ev.is_object()) return;
        if (ev.contains("error")) {
            error = ev["error"].value("message", ev["error"].dump());
            return;
        }
        if (!ev.contains("choices") || ev["choices"].empty()) return;
        const json &delta = ev["choices"][0]["delta"];
        if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string()) {
            if (!in_reasoning) std::fputs(tty ? "\x1b[2m" : "[thinking] ", stdout);
            in_reasoning = true;
            std::fputs(delta["reasoning_content"].get<std::string>().c_str(), stdout);
        }
        if (delta.contains("content") && delta["content"].is_string()) {
            if (in_reasoning) std::fputs(tty ? "\x1b[0m\n" : "\n", stdout);
            in_reasoning = false;
            const std::string piece = delta["content"].get<std::string>();
            content += piece;
            std::fputs(piece.c_str(), stdout);
        }
        if (delta.contains("tool_calls"))
            for (const json &c : delta["tool_calls"])
                if (c.contains("function")) {
                    const json &f = c["function"];
                    if (f.contains("name")) std::printf("\n[tool call] %s ", f["name"].get<std::string>().c_str());
                    if (f.contains("arguments")) std::fputs(f["arguments"].get<std::string>().c_str(), stdout);
                }
        std::fflush(stdout);
    };

    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.headers = headers_of(a);
    req.set_header("Content-Type", "application/json");
    req.body = body.dump();
    req.content_receiver = [&](const char *p, size_t n, uint64_t, uint64_t) {
        raw.append(p, n);
        pending.append(p, n);
        for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
            const std::string event = pending.substr(0, end);
            pending.erase(0, end + 2);
            if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
        }
        return true;
    };
    auto res = cli.send(req);
    if (in_reasoning) std::fputs(tty ? "\x1b[0m" : "", stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (!res) {
        std::fprintf(stderr, "ds41rt chat: %s: %s\n", a.url.c_str(), httplib::to_string(res.error()).c_str());
        return std::nullopt;
    }
    if (res->status != 200) {
        std::fprintf(stderr, "ds41rt chat: %s\n", error_text(res->status, raw).c_str());
        return std::nullopt;
    }
    if (!error.empty()) {
        std::fprintf(stderr, "ds41rt chat: %s\n", error.c_str());
        return std::nullopt;
    }
    return content;
}

int run_chat(chat_args a) {
    httplib::Client cli(a.url);
    cli.set_read_timeout(600, 0);
    if (a.model.empty()) {
        auto res = cli.Get("/v1/models", headers_of(a));
        if (!res) {
            std::fprintf(stderr, "ds41rt chat: cannot reach %s: %s\n", a.url.c_str(), httplib::to_string(res.error()).c_str());
            return 1;
        }
        const json j = json::parse(res->body, nullptr, false);
        if (res->status != 200 || !j.is_object() || !j.contains("data") || j["data"].empty()) {
            std::fprintf(stderr, "ds41rt chat: %s/v1/models: %s\n", a.url.c_str(), error_text(res->status, res->body).c_str());
            return 1;
        }
        a.model = j["data"][0]["id"].get<std::string>();
    }
    const bool tty = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO);
    auto fresh = [&] {
        json m = json::array();
        if (!a.system.empty()) m.push_back({{"role", "system"}, {"content", a.system}});
        return m;
    };
    json messages = fresh();
    if (tty) std::fprintf(stderr, "ds41rt chat: %s at %s; /reset starts over, /quit ends\n", a.model.c_str(), a.url.c_str());
    std::string line;
    int failures = 0;
    while (true) {
        if (tty) std::fputs("> ", stdout), std::fflush(stdout);
        if (!std::getline(std::cin, line) || line == "/quit") break;
        if (line == "/reset") {
            messages = fresh();
            continue;
        }
        if (line.empty()) continue;
        messages.push_back({{"role", "user"}, {"content", line}});
        auto reply = turn(cli, a, messages, tty);
        if (!reply) {
            messages.erase(messages.end() - 1);  // the turn did not happen
            failures++;
            continue;
        }
        messages.push_back({{"role", "assistant"}, {"content", *reply}});
    }
    return failures == 0 ? 0 : 1;
}

}  // namespace

void register_chat(CLI::App &app, command_list &cmds) {
    auto a = std::make_shared<chat_args>();
    auto *sub = app.add_subcommand("chat", "terminal client for a running server: one line per user turn, replies streamed");
    sub->add_option("--url", a->url, "server base URL")->capture_default_str();
    sub->add_option("--api-key", a->api_key, "the server's --api-key");
    sub->add_option("--model", a->model, "model id (default: the first the server lists)");
    sub->add_option("--system", a->system, "a system prompt");
    sub->add_flag("--no-thinking", a->no_thinking, "thinking disabled (reply without reasoning)");
    sub->add_option("--max-tokens", a->max_tokens, "max_tokens per reply")->check(CLI::PositiveNumber)->capture_default_str();
    sub->add_option("--temperature", a->temperature, "sampling temperature (default: greedy)");
    cmds.push_back({sub, [a] { return run_chat(*a); }});
}

}  // namespace ds41rt::app
