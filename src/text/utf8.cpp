#include "text/utf8.h"

#include <cstdint>

namespace ds41rt::text {

namespace {

// How far a sequence starting at bytes[pos] stays well-formed: sets *need to the length its lead
// byte asks for (0 for a byte that cannot lead) and returns how many bytes conform (>= 1 when
// need > 0). Second-byte ranges follow Unicode table 3-7 (no overlongs, surrogates, > U+10FFFF).
size_t conforming_prefix(std::string_view bytes, size_t pos, size_t *need) {
    auto b = [&](size_t i) { return static_cast<uint8_t>(bytes[pos + i]); };
    uint8_t b0 = b(0);
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 < 0x80) {
        *need = 1;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
        *need = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        *need = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        *need = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *need = 0;
        return 0;
    }
    size_t avail = bytes.size() - pos;
    size_t k = 1;
    if (k < *need && k < avail && b(1) >= lo && b(1) <= hi) {
        ++k;
        while (k < *need && k < avail && b(k) >= 0x80 && b(k) <= 0xBF) ++k;
    }
    return k;
}

}  // namespace

size_t utf8_valid_length(std::string_view bytes, size_t pos) {
    size_t need = 0;
    size_t k = conforming_prefix(bytes, pos, &need);
    return need > 0 && k == need ? need : 0;
}

std::string utf8_lossy(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    size_t i = 0;
    while (i < bytes.size()) {
        size_t need = 0;
        size_t k = conforming_prefix(bytes, i, &need);
        if (need > 0 && k == need) {
            out.append(bytes.data() + i, k);
            i += k;
        } else {
            out.append("\xEF\xBF\xBD");
            i += k > 0 ? k : 1;
        }
    }
    return out;
}

size_t utf8_incomplete_tail(std::string_view bytes) {
    for (size_t k = 1; k <= 3 && k <= bytes.size(); ++k) {
        size_t pos = bytes.size() - k;
        size_t need = 0;
        size_t conf = conforming_prefix(bytes, pos, &need);
        if (need > k && conf == k) return k;
        if (need > 0) break;  // a lead byte that is complete or broken: nothing to hold back
    }
    return 0;
}

}  // namespace ds41rt::text
