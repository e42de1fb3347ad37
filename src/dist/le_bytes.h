// Little-endian field packing and the CRC-32 of the expert wire formats (wire.cpp's frames,
// nccl_wire.cpp's bootstrap and data header): one copy for both codecs, so they cannot drift.
// Internal to dist: include only from its .cpp files.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ds41rt::dist::le {

inline void put16(uint8_t *p, uint16_t v) { p[0] = uint8_t(v), p[1] = uint8_t(v >> 8); }
inline void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = uint8_t(v >> (8 * i));
}
inline void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = uint8_t(v >> (8 * i));
}
inline uint16_t get16(const uint8_t *p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= uint32_t(p[i]) << (8 * i);
    return v;
}
inline uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= uint64_t(p[i]) << (8 * i);
    return v;
}
inline void putf(uint8_t *p, float f) {
    uint32_t v;
    std::memcpy(&v, &f, 4);
    put32(p, v);
}
inline float getf(const uint8_t *p) {
    const uint32_t v = get32(p);
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}

// zlib's CRC-32 of n bytes (zlib takes uInt lengths; payloads are capped far below 4 GiB).
inline uint32_t crc(const uint8_t *p, size_t n) { return uint32_t(crc32(crc32(0L, Z_NULL, 0), p, uInt(n))); }

}  // namespace ds41rt::dist::le
