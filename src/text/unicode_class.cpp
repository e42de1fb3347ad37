// Two-stage lookup (256-code-point blocks, identical blocks shared) built from the generated
// range table, so a class lookup is two loads instead of a binary search over 1,576 ranges.
#include "text/unicode_class.h"

#include <array>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace ds41rt::text {

namespace {

struct class_range {
    uint32_t first;
    uint32_t last;
    char cls;
};

constexpr class_range CLASS_RANGES[] = {
#include "text/unicode_classes.inc"
};

// Oniguruma's \s for Unicode encodings is the White_Space property; probed against HF tokenizers
// (U+0085, U+00A0, U+1680, U+2028 are spaces; U+180E, U+200B, U+FEFF, U+001C..U+001F are not).
constexpr std::array<std::pair<uint32_t, uint32_t>, 10> WHITE_SPACE = {{
    {0x0009, 0x000D}, {0x0020, 0x0020}, {0x0085, 0x0085}, {0x00A0, 0x00A0}, {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
}};

constexpr uint32_t N_CODE_POINTS = 0x110000;
constexpr uint32_t BLOCK = 256;

struct class_table {
    std::vector<uint16_t> block_of;  // [N_CODE_POINTS / BLOCK]
    std::vector<uint8_t> blocks;     // [n_unique_blocks * BLOCK]

    class_table() {
        std::vector<uint8_t> flat(N_CODE_POINTS, 0);
        for (const class_range &r : CLASS_RANGES) {
            uint8_t bit = r.cls == 'L' ? UCLASS_L : r.cls == 'M' ? UCLASS_M : r.cls == 'N' ? UCLASS_N
                        : r.cls == 'P' ? UCLASS_P : UCLASS_S;
            for (uint32_t cp = r.first; cp <= r.last; ++cp) flat[cp] = bit;
        }
        for (auto [first, last] : WHITE_SPACE)
            for (uint32_t cp = first; cp <= last; ++cp) flat[cp] |= UCLASS_WS;
        // Identical blocks (most of the unassigned planes) are stored once, found by a hash.
        std::unordered_multimap<uint64_t, uint16_t> seen;
        block_of.resize(N_CODE_POINTS / BLOCK);
        for (uint32_t b = 0; b < N_CODE_POINTS / BLOCK; ++b) {
            const uint8_t *blk = flat.data() + size_t(b) * BLOCK;
            uint64_t h = 1469598103934665603ull;
            for (uint32_t i = 0; i < BLOCK; ++i) h = (h ^ blk[i]) * 1099511628211ull;
            int32_t found = -1;
            auto [lo, hi] = seen.equal_range(h);
            for (auto it = lo; it != hi && found < 0; ++it)
                if (std::memcmp(blocks.data() + size_t(it->second) * BLOCK, blk, BLOCK) == 0) found = it->second;
            if (found < 0) {
                found = int32_t(blocks.size() / BLOCK);
                blocks.insert(blocks.end(), blk, blk + BLOCK);
                seen.emplace(h, uint16_t(found));
            }
            block_of[b] = uint16_t(found);
        }
    }
};

const class_table &table() {
    static const class_table t;
    return t;
}

}  // namespace

const unicode_class_table &unicode_class_lookup() {
    static const unicode_class_table lookup{table().block_of.data(), table().blocks.data()};
    return lookup;
}

uint8_t unicode_class(uint32_t cp) { return unicode_class_lookup()(cp); }

}  // namespace ds41rt::text
