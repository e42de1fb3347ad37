// HTTP routes, authentication, streaming and error mapping (see http_server.h).
#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>

#include <nlohmann/json.hpp>

#include "server/metrics_text.h"
#include "server/openai_errors.h"
#include "server/openai_response.h"

namespace ds41rt::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string dump(const json &j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The scheduler's events for one request, handed from the scheduler thread to the HTTP thread.
struct channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<serving::generation_event> events;
    bool done = false;

    void push(const serving::generation_event &ev) {
        {
            std::lock_guard<std::mutex> lk(mu);
            events.push_back(ev);
            if (ev.finished) done = true;
        }
        cv.notify_all();
    }
    // Waits up to `timeout` for events; returns what arrived (possibly nothing).
    std::deque<serving::generation_event> take(std::chrono::milliseconds timeout) {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait_for(lk, timeout, [&] { return !events.empty(); });
        std::deque<serving::generation_event> out;
        out.swap(events);
        return out;
    }
};

// An ERROR or CANCELLED end as an API error.
api_error error_of_event(const serving::generation_event &ev) {
    if (ev.reason == serving::finish_reason::CANCELLED)
        return make_error(503, "server_error", "cancelled", "the request was cancelled (the server is shutting down)");
    if (ev.error.code() == status_code::UNAVAILABLE)  // an expert worker did not answer: retry later
        return make_error(503, "server_error", "service_unavailable", "generation failed: " + ev.error.message());
    return make_error(500, "server_error", "engine_error", "generation failed: " + ev.error.to_string());
}

}  // namespace

struct http_server::impl {
    serving::scheduler &sched;
    api_context ctx;
    server_options opt;
    httplib::Server svr;
    std::atomic<bool> ready{false};
    std::atomic<uint64_t> next_id{1};
    int bound_port = -1;
    int listen_fd = -1;  // the listening socket, seen by the socket-options hook before bind
    std::mutex counters_mu;
    http_counters counters;  // guarded by counters_mu

    impl(serving::scheduler &s, api_context c, server_options o) : sched(s), ctx(std::move(c)), opt(std::move(o)) {}

    void send_error(httplib::Response &res, const api_error &e) {
        res.status = e.http_status;
        if (e.http_status == 429) res.set_header("Retry-After", "1");
        if (e.http_status == 401) res.set_header("WWW-Authenticate", "Bearer");
        res.set_content(error_body(e), "application/json");
    }

    bool authorized(const httplib::Request &req) const {
        if (opt.api_key.empty()) return true;
        return req.get_header_value("Authorization") == "Bearer " + opt.api_key;
    }

    std::string new_id(const char *prefix) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%016llx", prefix,
                      (unsigned long long)(next_id.fetch_add(1) * 0x9E3779B97F4A7C15ull));
        return buf;
    }

    // Wraps a route: authentication, and no exception escapes.
    httplib::Server::Handler guard(bool needs_auth, std::function<void(const httplib::Request &, httplib::Response &)> fn) {
        return [this, needs_auth, fn = std::move(fn)](const httplib::Request &req, httplib::Response &res) {
            try {
                if (needs_auth && !authorized(req)) {
                    send_error(res, make_error(401, "invalid_request_error", "invalid_api_key",
                                               "missing or wrong API key (send Authorization: Bearer <key>)"));
                    return;
                }
                fn(req, res);
            } catch (const std::exception &e) {
                send_error(res, make_error(500, "server_error", "internal_error", std::string("internal error: ") + e.what()));
            } catch (...) {
                send_error(res, make_error(500, "server_error", "internal_error", "internal error"));
            }
        };
    }

    void handle_generate(const httplib::Request &req, httplib::Response &res, bool chat) {
        if (req.body.size() > opt.max_body_bytes) {
            send_error(res, make_error(413, "invalid_request_error", "request_too_large",
                                       "the request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes"));
            return;
        }
        // nlohmann rejects ill-formed UTF-8 inside strings, so invalid UTF-8 is a parse error too.
        ojson body = ojson::parse(req.body, nullptr, /*allow_exceptions=*/false);
        if (body.is_discarded()) {
            send_error(res, make_error(400, "invalid_request_error", "invalid_json",
                                       "the request body is not valid JSON (or not valid UTF-8)"));
            return;
        }
        Result<api_request> parsed = chat ? parse_chat_completion(body, ctx) : parse_completion(body, ctx);
        if (!parsed) {
            send_error(res, error_from_status(parsed.status()));
            return;
        }
        api_request r = std::move(parsed.value());
        auto ch = std::make_shared<channel>();
        r.gen.on_event = [ch](const serving::generation_event &ev) { ch->push(ev); };
        const bool stream = r.stream;
        auto builder = std::make_shared<response_builder>(r, ctx, new_id(chat ? "chatcmpl-" : "cmpl-"),
                                                          int64_t(std::time(nullptr)));
        Result<serving::request_id> id = sched.submit(std::move(r.gen));
        if (!id) {
            send_error(res, error_from_status(id.status()));
            return;
        }
        const serving::request_id rid = *id;
        if (!stream) {
            for (;;) {
                bool finished = false;
                for (auto &ev : ch->take(std::chrono::milliseconds(1000))) {
                    if (ev.finished && (ev.reason == serving::finish_reason::ERROR ||
                                        ev.reason == serving::finish_reason::CANCELLED)) {
                        send_error(res, error_of_event(ev));
                        return;
                    }
                    builder->add(ev);
                    finished = finished || ev.finished;
                }
                if (finished) break;
            }
            res.set_content(dump(builder->whole()), "application/json");
            return;
        }
        struct stream_state {
            bool started = false;
            std::atomic<bool> finished{false};
        };
        auto st = std::make_shared<stream_state>();
        serving::scheduler *sched_ptr = &sched;
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        res.set_chunked_content_provider(
            "text/event-stream",
            [ch, builder, st, sched_ptr, rid](size_t, httplib::DataSink &sink) -> bool {
                auto send = [&](const std::string &s) { return sink.write(s.data(), s.size()); };
                auto give_up = [&] {
                    sched_ptr->cancel(rid);
                    return false;
                };
                try {
                    if (!st->started) {
                        st->started = true;
                        for (auto &c : builder->stream_start())
                            if (!send("data: " + dump(c) + "\n\n")) return give_up();
                    }
                    auto evs = ch->take(std::chrono::milliseconds(1000));
                    if (evs.empty()) {
                        if (!send(": keep-alive\n\n")) return give_up();
                        return true;
                    }
                    for (auto &ev : evs) {
                        if (ev.finished && (ev.reason == serving::finish_reason::ERROR ||
                                            ev.reason == serving::finish_reason::CANCELLED)) {
                            api_error e = error_of_event(ev);
                            json body = json::parse(error_body(e));
                            send("data: " + dump(body) + "\n\n");
                            send("data: [DONE]\n\n");
                            st->finished = true;
                            sink.done();
                            return true;
                        }
                        for (auto &c : builder->stream_event(ev))
                            if (!send("data: " + dump(c) + "\n\n")) return give_up();
                        if (ev.finished) {
                            st->finished = true;
                            if (!send("data: [DONE]\n\n")) return false;
                            sink.done();
                            return true;
                        }
                    }
                    return true;
                } catch (...) {
                    return give_up();
                }
            },
            [st, sched_ptr, rid](bool) {
                if (!st->finished) sched_ptr->cancel(rid);
            });
    }

    void handle_models(const httplib::Request &, httplib::Response &res) {
        json m;
        m["id"] = ctx.model_id;
        m["object"] = "model";
        m["created"] = 0;
        m["owned_by"] = "ds41rt";
        m["max_context_tokens"] = ctx.max_context;
        m["max_output_tokens"] = ctx.max_output_tokens;
        json out;
        out["object"] = "list";
        out["data"] = json::array({m});
        res.set_content(dump(out), "application/json");
    }

    void handle_health(const httplib::Request &, httplib::Response &res) {
        if (!ready.load()) {
            send_error(res, make_error(503, "server_error", "not_ready", "the server is starting (first generation probe pending)"));
            return;
        }
        res.set_content("{\"status\":\"ok\"}", "application/json");
    }

    void handle_metrics(const httplib::Request &, httplib::Response &res) {
        http_counters h;
        {
            std::lock_guard<std::mutex> lk(counters_mu);
            h = counters;
        }
        res.set_content(render_metrics(sched.metrics(), h), "text/plain; version=0.0.4");
    }

    void install() {
        svr.set_payload_max_length(opt.max_body_bytes);
        // httplib's defaults (SO_REUSEADDR, ...), and the socket remembered so bind() can widen its
        // accept backlog (see there).
        svr.set_socket_options([this](socket_t sock) {
            httplib::default_socket_options(sock);
            listen_fd = int(sock);
        });
        const serving::scheduler_options &so = sched.options();
        const size_t threads = opt.worker_threads > 0 ? size_t(opt.worker_threads)
                                                      : size_t(so.max_running) + size_t(so.max_queue) + 4;
        svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
        svr.Post("/v1/chat/completions", guard(true, [this](const auto &q, auto &s) { handle_generate(q, s, true); }));
        svr.Post("/v1/completions", guard(true, [this](const auto &q, auto &s) { handle_generate(q, s, false); }));
        svr.Get("/v1/models", guard(true, [this](const auto &q, auto &s) { handle_models(q, s); }));
        svr.Get("/health", guard(false, [this](const auto &q, auto &s) { handle_health(q, s); }));
        svr.Get("/metrics", guard(false, [this](const auto &q, auto &s) { handle_metrics(q, s); }));
        // httplib's own refusals (unknown route 404, body too large 413, bad request 400) get an
        // OpenAI body too; responses that already have one are left alone.
        svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request &, httplib::Response &res) {
            if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
            switch (res.status) {
            case 404: send_error(res, make_error(404, "not_found_error", "not_found", "no such route")); break;
            case 405: send_error(res, make_error(405, "invalid_request_error", "method_not_allowed", "method not allowed")); break;
            case 413:
                send_error(res, make_error(413, "invalid_request_error", "request_too_large",
                                           "the request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes"));
                break;
            default:
                send_error(res, make_error(res.status, res.status >= 500 ? "server_error" : "invalid_request_error", "",
                                           "HTTP " + std::to_string(res.status)));
            }
            return httplib::Server::HandlerResponse::Handled;
        }));
        svr.set_exception_handler([this](const httplib::Request &, httplib::Response &res, std::exception_ptr) {
            send_error(res, make_error(500, "server_error", "internal_error", "internal error"));
        });
        svr.set_logger([this](const httplib::Request &, const httplib::Response &res) {
            std::lock_guard<std::mutex> lk(counters_mu);
            counters.responses_by_status[res.status]++;
        });
    }
};

http_server::http_server(serving::scheduler &sched, api_context ctx, server_options opt)
    : impl_(std::make_unique<impl>(sched, std::move(ctx), std::move(opt))) {
    impl_->install();
}

http_server::~http_server() { stop(); }

Status http_server::bind() {
    if (impl_->opt.port == 0) {
        impl_->bound_port = impl_->svr.bind_to_any_port(impl_->opt.host);
        if (impl_->bound_port < 0) return Status::unavailable("cannot bind " + impl_->opt.host + ":0");
    } else {
        if (!impl_->svr.bind_to_port(impl_->opt.host, impl_->opt.port))
            return Status::unavailable("cannot bind " + impl_->opt.host + ":" + std::to_string(impl_->opt.port));
        impl_->bound_port = impl_->opt.port;
    }
    // The httplib build we link (Debian's libcpp-httplib 0.11) listens with a backlog of 5: a burst
    // of more simultaneous connects than that overflows the accept queue, the kernel drops the
    // handshakes, and under load some clients get "connection reset by peer" instead of a slow
    // start (tests/e2e/test_concurrency.py: 64 clients at once). Linux lets listen() on a
    // listening socket change its backlog; the kernel caps it at net.core.somaxconn.
    if (impl_->listen_fd >= 0 && ::listen(impl_->listen_fd, 4096) != 0)
        return Status::unavailable("cannot set the listen backlog on " + impl_->opt.host);
    return Status::ok();
}

int http_server::port() const { return impl_->bound_port; }

void http_server::serve() { impl_->svr.listen_after_bind(); }

void http_server::stop() {
    if (impl_) impl_->svr.stop();
}

void http_server::set_ready(bool r) { impl_->ready = r; }

}  // namespace ds41rt::server
