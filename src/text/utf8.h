// UTF-8 repair for decoded token bytes: byte-level BPE ids can end or start in the middle of a
// character, so decode needs HF's lossy conversion and streaming needs to know where to cut.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ds41rt::text {

// Valid UTF-8 copied as is; each maximal ill-formed subpart (the longest prefix of a well-formed
// sequence, or one byte) becomes U+FFFD. This is Unicode's recommended practice and what Rust's
// String::from_utf8_lossy (HF decode) and Python's bytes.decode(errors="replace") do.
std::string utf8_lossy(std::string_view bytes);

// Number of trailing bytes that are a proper prefix of a well-formed sequence, i.e. a character
// that later bytes may still complete (0..3). A stream emits bytes.substr(0, size - this) now and
// keeps the rest; bytes that can never become valid are not held back.
size_t utf8_incomplete_tail(std::string_view bytes);

// Length of the well-formed sequence at bytes[pos], or 0 when it is ill-formed or truncated.
size_t utf8_valid_length(std::string_view bytes, size_t pos);

}  // namespace ds41rt::text
