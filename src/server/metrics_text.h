// Prometheus text exposition (format 0.0.4) of the scheduler's metrics and the server's own
// counters, for GET /metrics. Names carry the ds41rt_ prefix; latencies are in seconds.
//
// Threading: a pure function of the snapshots it is given.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "serving/metrics.h"

namespace ds41rt::server {

struct http_counters {
    std::map<int, uint64_t> responses_by_status;  // HTTP status -> count
};

std::string render_metrics(const serving::scheduler_metrics &m, const http_counters &h);

}  // namespace ds41rt::server
