// Serving metrics: the counters and histograms the scheduler keeps, as a plain snapshot the
// server renders (Prometheus text in server/metrics_text).
//
// Threading: `histogram` is a value type with no locking; the scheduler updates its copies under
// its own mutex and hands out snapshots by value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ds41rt::serving {

// Cumulative-bucket histogram with fixed upper bounds (Prometheus semantics: bucket i counts
// observations <= bounds[i]; +Inf is `count`).
struct histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> buckets;  // same size as bounds, NOT cumulative (rendering sums)
    uint64_t count = 0;
    double sum = 0;

    histogram() = default;
    explicit histogram(std::vector<double> b) : bounds(std::move(b)), buckets(bounds.size(), 0) {}
    void observe(double v);
};

// Latency buckets in seconds (1 ms .. 60 s) and batch buckets in rows.
std::vector<double> latency_buckets();
std::vector<double> batch_buckets();

struct scheduler_metrics {
    // Requests by outcome.
    uint64_t requests_submitted = 0;
    uint64_t requests_rejected = 0;   // queue full
    uint64_t requests_finished_stop = 0;
    uint64_t requests_finished_length = 0;
    uint64_t requests_cancelled = 0;
    uint64_t requests_failed = 0;
    // Tokens.
    uint64_t prompt_tokens = 0;       // prefilled
    uint64_t generation_tokens = 0;   // sampled
    uint64_t engine_steps = 0;
    // Gauges.
    int64_t queue_depth = 0;          // waiting for admission
    int64_t running = 0;              // holding an engine sequence
    int64_t live_sequences = 0;       // engine sequences created and not yet freed
    // Histograms.
    histogram time_to_first_token{latency_buckets()};    // submit -> first token, seconds
    histogram inter_token_latency{latency_buckets()};    // between tokens of one request, seconds
    histogram batch_sequences{batch_buckets()};          // sequences per engine step
    histogram batch_tokens{batch_buckets()};             // tokens per engine step
};

}  // namespace ds41rt::serving
