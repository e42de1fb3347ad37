// Prometheus text rendering (see metrics_text.h).
#include "server/metrics_text.h"

#include <cstdio>

namespace ds41rt::server {

namespace {

std::string num(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

void head(std::string &out, const char *name, const char *type, const char *help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void counter(std::string &out, const char *name, const char *help, double v) {
    head(out, name, "counter", help);
    out += std::string(name) + " " + num(v) + "\n";
}

void gauge(std::string &out, const char *name, const char *help, double v) {
    head(out, name, "gauge", help);
    out += std::string(name) + " " + num(v) + "\n";
}

void hist(std::string &out, const char *name, const char *help, const serving::histogram &h) {
    head(out, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds.size(); i++) {
        cum += h.buckets[i];
        out += std::string(name) + "_bucket{le=\"" + num(h.bounds[i]) + "\"} " + std::to_string(cum) + "\n";
    }
    out += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    out += std::string(name) + "_sum " + num(h.sum) + "\n";
    out += std::string(name) + "_count " + std::to_string(h.count) + "\n";
}

}  // namespace

std::string render_metrics(const serving::scheduler_metrics &m, const http_counters &h) {
    std::string out;
    head(out, "ds41rt_requests_total", "counter", "Generation requests by outcome.");
    auto req = [&](const char *outcome, uint64_t v) {
        out += std::string("ds41rt_requests_total{outcome=\"") + outcome + "\"} " + std::to_string(v) + "\n";
    };
    req("stop", m.requests_finished_stop);
    req("length", m.requests_finished_length);
    req("cancelled", m.requests_cancelled);
    req("error", m.requests_failed);
    req("rejected", m.requests_rejected);
    counter(out, "ds41rt_requests_submitted_total", "Generation requests admitted to the queue.", double(m.requests_submitted));
    counter(out, "ds41rt_prompt_tokens_total", "Prompt tokens prefilled.", double(m.prompt_tokens));
    counter(out, "ds41rt_generation_tokens_total", "Tokens generated.", double(m.generation_tokens));
    counter(out, "ds41rt_engine_steps_total", "Engine steps run.", double(m.engine_steps));
    gauge(out, "ds41rt_queue_depth", "Requests waiting for admission.", double(m.queue_depth));
    gauge(out, "ds41rt_running_requests", "Requests holding an engine sequence.", double(m.running));
    gauge(out, "ds41rt_live_sequences", "Engine sequences allocated.", double(m.live_sequences));
    hist(out, "ds41rt_time_to_first_token_seconds", "Submit to first generated token.", m.time_to_first_token);
    hist(out, "ds41rt_inter_token_latency_seconds", "Time between consecutive tokens of one request.", m.inter_token_latency);
    hist(out, "ds41rt_batch_sequences", "Sequences per engine step.", m.batch_sequences);
    hist(out, "ds41rt_batch_tokens", "Tokens per engine step.", m.batch_tokens);
    head(out, "ds41rt_http_responses_total", "counter", "HTTP responses by status code.");
    for (auto [code, n] : h.responses_by_status)
        out += "ds41rt_http_responses_total{code=\"" + std::to_string(code) + "\"} " + std::to_string(n) + "\n";
    return out;
}

}  // namespace ds41rt::server
