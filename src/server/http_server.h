// The HTTP/1.1 front door: OpenAI-compatible routes over cpp-httplib (hidden behind a pimpl, so
// nothing else includes httplib.h).
//
// Routes: POST /v1/chat/completions and /v1/completions (whole, or SSE "data: {...}\n\n" chunks
// ending with "data: [DONE]"), GET /v1/models, GET /health (503 until set_ready(true), then 200),
// GET /metrics (Prometheus text). With an API key, /v1/* needs "Authorization: Bearer KEY" (401
// otherwise); /health and /metrics stay open.
//
// Errors: every refusal is an OpenAI error body (server/openai_errors.h): malformed JSON or
// invalid UTF-8 400, a bad field 400 naming it, unknown model 404, unknown route 404, a body over
// max_body_bytes 413, a full queue 429 with Retry-After. Admission errors are answered before
// any stream starts, so they keep their status for SSE too. Handlers never throw: anything thrown
// inside one becomes a 500 body.
//
// Cancellation: a streaming client that goes away (a write fails, or the connection closes
// before the end) cancels its request; while nothing is generated (a long prefill) a ": keep-alive"
// comment goes out every second so a closed connection is noticed. A non-streamed request whose
// client goes away runs to its end (httplib 0.11 does not report the close).
//
// Threading: handlers run on httplib's worker pool; they talk to the scheduler through submit()
// and cancel() and wait on a per-request channel the scheduler's callback fills. The scheduler
// and tokenizer must outlive the server. serve() blocks; stop() and set_ready() may be called from
// any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/openai_request.h"
#include "serving/scheduler.h"

namespace ds41rt::server {

struct server_options {
    std::string host = "127.0.0.1";
    int port = 8000;                          // 0: any free port (see port())
    std::string api_key;                      // empty: no authentication
    size_t max_body_bytes = 16u << 20;
    int worker_threads = 0;                   // 0: max_running + max_queue + 4
};

class http_server {
public:
    http_server(serving::scheduler &sched, api_context ctx, server_options opt);
    ~http_server();

    Status bind();   // binds host:port; UNAVAILABLE naming them when it cannot
    int port() const;
    void serve();    // blocks until stop()
    void stop();
    void set_ready(bool ready);

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace ds41rt::server
