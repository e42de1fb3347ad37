#include "text/byte_level.h"

#include "text/unicode_class.h"

namespace ds41rt::text {

namespace {

bool maps_to_itself(uint32_t b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct alphabet {
    uint32_t char_of[256];
    int16_t byte_of[0x200];  // every character of the alphabet is below U+0144

    alphabet() {
        for (auto &b : byte_of) b = -1;
        uint32_t next = 0x100;
        for (uint32_t b = 0; b < 256; ++b) {
            char_of[b] = maps_to_itself(b) ? b : next++;
            byte_of[char_of[b]] = static_cast<int16_t>(b);
        }
    }
};

const alphabet &get() {
    static const alphabet a;
    return a;
}

void append_utf8(uint32_t cp, std::string *out) {
    if (cp < 0x80) {
        out->push_back(char(cp));
    } else if (cp < 0x800) {
        out->push_back(char(0xC0 | (cp >> 6)));
        out->push_back(char(0x80 | (cp & 0x3F)));
    } else {
        // The alphabet never needs more than two bytes; callers only pass its characters.
        out->push_back(char(0xE0 | (cp >> 12)));
        out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(char(0x80 | (cp & 0x3F)));
    }
}

}  // namespace

uint32_t byte_level_char(uint8_t b) { return get().char_of[b]; }

bool byte_level_to_bytes(std::string_view spelled, std::string *bytes) {
    const alphabet &a = get();
    bytes->clear();
    const auto *p = reinterpret_cast<const unsigned char *>(spelled.data());
    const auto *end = p + spelled.size();
    while (p < end) {
        uint32_t cp;
        p += utf8_step(p, end, &cp);
        if (cp >= 0x200 || a.byte_of[cp] < 0) return false;
        bytes->push_back(static_cast<char>(a.byte_of[cp]));
    }
    return true;
}

std::string bytes_to_byte_level(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) append_utf8(byte_level_char(static_cast<uint8_t>(c)), &out);
    return out;
}

}  // namespace ds41rt::text
