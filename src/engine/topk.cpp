#include "engine/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace ds41rt::engine {

std::vector<int64_t> top_indices(const float *v, int64_t n, int64_t k) {
    k = std::min(k, n);
    if (k <= 0) return {};
    using elem_t = std::pair<double, int64_t>;
    std::vector<elem_t> queue(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; j++) queue[size_t(j)] = {double(v[j]), j};
    auto greater = [](const elem_t &x, const elem_t &y) {
        return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
    };
    if (k * 64 <= n) {
        std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), greater);
    } else {
        std::nth_element(queue.begin(), queue.begin() + (k - 1), queue.end(), greater);
        std::sort(queue.begin(), queue.begin() + (k - 1), greater);
    }
    const double neg_inf = -std::numeric_limits<double>::infinity();
    std::vector<int64_t> idx;
    for (int64_t j = 0; j < k; j++)
        if (queue[size_t(j)].first != neg_inf) idx.push_back(queue[size_t(j)].second);
    return idx;
}

std::vector<int64_t> top_indices_ordered(const float *v, int64_t n, int64_t k) {
    k = std::min(k, n);
    if (k <= 0) return {};
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) idx[size_t(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    idx.resize(size_t(k));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    idx.erase(std::remove_if(idx.begin(), idx.end(), [&](int64_t i) { return v[i] == neg_inf; }), idx.end());
    return idx;
}

}  // namespace ds41rt::engine
