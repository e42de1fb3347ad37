// Remembers the BPE ids of recently seen pieces: natural text repeats its words, and a lookup is
// far cheaper than re-running the merges.
//
// Direct-mapped (a piece hashes to one slot; a newcomer replaces the occupant), so memory is fixed
// and a slot's buffers are reused rather than reallocated. Slots are guarded by striped mutexes,
// so concurrent encodes rarely wait on each other. Results never depend on the cache.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace ds41rt::text {

class word_cache {
public:
    // Pieces longer than this are not cached (long runs of spaces, base64): they rarely repeat.
    static constexpr size_t MAX_PIECE = 48;

    word_cache();

    // Appends the cached ids of `piece` to *out and returns true, or returns false.
    bool lookup(std::string_view piece, std::vector<int32_t> *out) const;
    void insert(std::string_view piece, const int32_t *ids, size_t n_ids) const;

private:
    struct slot {
        std::string piece;
        std::vector<int32_t> ids;
    };
    static constexpr size_t N_SLOTS = 1 << 16;
    static constexpr size_t N_STRIPES = 64;

    static uint64_t hash(std::string_view s);

    mutable std::unique_ptr<slot[]> slots_;               // GUARDED_BY(stripes_[i % N_STRIPES])
    mutable std::unique_ptr<std::mutex[]> stripes_;
};

}  // namespace ds41rt::text
