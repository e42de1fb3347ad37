// GPT-2's byte <-> character alphabet: byte-level BPE vocabularies spell every byte as one
// printable character (bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF as themselves, the other 68 bytes as
// U+0100.. in byte order), so a token string like "Ġthe" stands for the bytes " the".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ds41rt::text {

// The character that spells byte b.
uint32_t byte_level_char(uint8_t b);

// Raw bytes of a token string spelled in the alphabet; false (and *bytes unspecified) when a
// character is not in the alphabet or the string is not valid UTF-8.
bool byte_level_to_bytes(std::string_view spelled, std::string *bytes);

// Spells raw bytes in the alphabet (UTF-8 out).
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace ds41rt::text
