// Byte sizes as people write them: parsing budgets ("32GiB", "141GB") and printing charges.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace ds41rt::dist {

// "32GiB", "141GB", "1.5 TiB", "512MiB", "1073741824" -> bytes. Decimal (kB, MB, GB, TB) and
// binary (KiB, MiB, GiB, TiB) units, case-insensitive; a bare number is bytes. Fractions are
// rounded down to a byte. INVALID_ARGUMENT names the text.
Result<uint64_t> parse_size(std::string_view text);

// Binary units with two decimals: "6.72 GiB", "528.00 KiB"; below 1 KiB plain bytes ("17 B").
std::string format_size(uint64_t bytes);
// Always GiB with two decimals ("3.10 GiB"): the unit of every refusal message.
std::string format_gib(uint64_t bytes);

}  // namespace ds41rt::dist
