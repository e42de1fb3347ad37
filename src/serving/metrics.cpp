// Serving metrics (see metrics.h).
#include "serving/metrics.h"

namespace ds41rt::serving {

void histogram::observe(double v) {
    for (size_t i = 0; i < bounds.size(); i++)
        if (v <= bounds[i]) {
            buckets[i]++;
            break;
        }
    count++;
    sum += v;
}

std::vector<double> latency_buckets() {
    return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

std::vector<double> batch_buckets() { return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096}; }

}  // namespace ds41rt::serving
