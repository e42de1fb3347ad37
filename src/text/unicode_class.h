// Unicode facts the pre-tokenizer needs: a coarse general-category class per code point and a
// forgiving UTF-8 step that marks invalid bytes instead of failing.
//
// The class table is Unicode 16.0 (generated into unicode_classes.inc by
// tools/reference/unicode_classes.py), because that is what HF tokenizers' Oniguruma uses; the
// system PCRE2 (Unicode 14) would split text with newer letters differently. Thread-safe: the
// lookup table is built once on first use and never changes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ds41rt::text {

// Bit flags; a code point has at most one of L/M/N/P/S, and WS is independent of them.
enum unicode_class_bits : uint8_t {
    UCLASS_L = 1,         // letters (Lu Ll Lt Lm Lo)
    UCLASS_M = 2,         // marks (Mn Mc Me)
    UCLASS_N = 4,         // numbers (Nd Nl No)
    UCLASS_P = 8,         // punctuation (Pc Pd Ps Pe Pi Pf Po)
    UCLASS_S = 16,        // symbols (Sm Sc Sk So)
    UCLASS_WS = 32,       // White_Space, which is what Oniguruma's \s matches
    UCLASS_INVALID = 64,  // a byte that does not start a valid UTF-8 sequence: matches nothing
};

// Coarse class of a valid code point (0 for controls, format characters, unassigned, ...).
uint8_t unicode_class(uint32_t cp);

// The lookup behind unicode_class, for loops that classify many code points: fetch it once with
// unicode_class_lookup() and call it inline (no initialisation guard per character).
struct unicode_class_table {
    const uint16_t *block_of;  // [0x110000 / 256] block index per 256 code points
    const uint8_t *blocks;     // [n_blocks * 256] classes
    uint8_t operator()(uint32_t cp) const {
        return cp < 0x110000 ? blocks[size_t(block_of[cp >> 8]) * 256 + (cp & 0xFF)] : 0;
    }
};
const unicode_class_table &unicode_class_lookup();

// ASCII is most of the text the pre-tokenizer sees, so its classes are a constant table here
// (the test checks it against unicode_class).
constexpr uint8_t ascii_class_of(uint32_t c) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) return UCLASS_L;
    if (c >= '0' && c <= '9') return UCLASS_N;
    if ((c >= 0x09 && c <= 0x0D) || c == ' ') return UCLASS_WS;
    if (c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '`' || c == '|' || c == '~')
        return UCLASS_S;
    if (c > 0x20 && c < 0x7F) return UCLASS_P;
    return 0;
}

struct ascii_class_table {
    uint8_t cls[128];
    constexpr ascii_class_table() : cls() {
        for (uint32_t c = 0; c < 128; ++c) cls[c] = ascii_class_of(c);
    }
};
inline constexpr ascii_class_table ASCII_CLASSES{};


// One decoding step at p (p < end). Returns the sequence length and sets *cp. An invalid or
// truncated sequence yields length 1 and *cp = UTF8_INVALID, so every byte is consumed exactly once.
inline constexpr uint32_t UTF8_INVALID = 0xFFFFFFFFu;
inline size_t utf8_step(const unsigned char *p, const unsigned char *end, uint32_t *cp) {
    unsigned char b0 = p[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    size_t avail = size_t(end - p);
    // Well-formed sequences per Unicode table 3-7: the second byte's range depends on the first,
    // which rules out overlongs, surrogates and code points above U+10FFFF.
    auto cont = [&](size_t i, unsigned char lo, unsigned char hi) {
        return i < avail && p[i] >= lo && p[i] <= hi;
    };
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (cont(1, 0x80, 0xBF)) {
            *cp = (uint32_t(b0 & 0x1F) << 6) | (p[1] & 0x3F);
            return 2;
        }
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        unsigned char lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
        if (cont(1, lo, hi) && cont(2, 0x80, 0xBF)) {
            *cp = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
            return 3;
        }
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        unsigned char lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
        if (cont(1, lo, hi) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF)) {
            *cp = (uint32_t(b0 & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) |
                  (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
            return 4;
        }
    }
    *cp = UTF8_INVALID;
    return 1;
}


}  // namespace ds41rt::text
