#include "text/word_cache.h"

#include <cstring>

namespace ds41rt::text {

word_cache::word_cache()
    : slots_(std::make_unique<slot[]>(N_SLOTS)), stripes_(std::make_unique<std::mutex[]>(N_STRIPES)) {}

uint64_t word_cache::hash(std::string_view s) {
    // FNV-1a: pieces are a few bytes long, so a byte loop beats a block hash's setup.
    uint64_t h = 1469598103934665603ull;
    for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    return h ^ (h >> 29);
}

bool word_cache::lookup(std::string_view piece, std::vector<int32_t> *out) const {
    size_t i = hash(piece) & (N_SLOTS - 1);
    std::lock_guard<std::mutex> lock(stripes_[i % N_STRIPES]);
    const slot &s = slots_[i];
    if (s.piece.size() != piece.size() || std::memcmp(s.piece.data(), piece.data(), piece.size()) != 0 ||
        s.ids.empty())
        return false;
    out->insert(out->end(), s.ids.begin(), s.ids.end());
    return true;
}

void word_cache::insert(std::string_view piece, const int32_t *ids, size_t n_ids) const {
    size_t i = hash(piece) & (N_SLOTS - 1);
    std::lock_guard<std::mutex> lock(stripes_[i % N_STRIPES]);
    slot &s = slots_[i];
    s.piece.assign(piece);
    s.ids.assign(ids, ids + n_ids);
}

}  // namespace ds41rt::text
