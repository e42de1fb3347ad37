// Byte-level BPE merges: turns one pre-tokenized piece (raw bytes) into token ids.
//
// Merging follows HF's BPE model exactly: start from one symbol per byte, repeatedly merge the
// adjacent pair with the lowest merge rank (leftmost first among equal ranks) until no adjacent
// pair has a merge. Thread-safe for concurrent encode_piece calls after construction; scratch
// space is per thread so a merge step allocates nothing.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ds41rt::text {

class bpe_merges {
public:
    // byte_ids[b]: the id of the single-byte token for byte b.
    explicit bpe_merges(const int32_t (&byte_ids)[256]);

    // Registers merge number `rank` (its position in the file): left + right -> merged.
    void add(int32_t left, int32_t right, int32_t rank, int32_t merged);
    size_t size() const { return n_; }

    // Appends the ids of `piece` to *out.
    void encode_piece(std::string_view piece, std::vector<int32_t> *out) const;

private:
    // Open addressing with linear probing over a power-of-two table: the merge lookup is the
    // innermost step of BPE, and std::unordered_map's modulo by a prime showed up in profiles.
    struct slot {
        uint64_t key = EMPTY;
        int32_t rank = 0;
        int32_t merged = 0;
    };
    static constexpr uint64_t EMPTY = ~uint64_t(0);  // ids are < 2^31, so no pair packs to this

    static uint64_t key(int32_t left, int32_t right) {
        return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    }
    static uint64_t mix(uint64_t k) {  // splitmix64 finaliser
        k ^= k >> 30;
        k *= 0xbf58476d1ce4e5b9ull;
        k ^= k >> 27;
        k *= 0x94d049bb133111ebull;
        return k ^ (k >> 31);
    }
    const slot *find(int32_t left, int32_t right) const {
        uint64_t k = key(left, right);
        for (size_t i = mix(k) & mask_;; i = (i + 1) & mask_) {
            const slot &s = slots_[i];
            if (s.key == k) return &s;
            if (s.key == EMPTY) return nullptr;
        }
    }
    void grow();

    int32_t byte_ids_[256];
    std::vector<slot> slots_;
    size_t mask_ = 0;
    size_t n_ = 0;
};

}  // namespace ds41rt::text
