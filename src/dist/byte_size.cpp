#include "dist/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace ds41rt::dist {

Result<uint64_t> parse_size(std::string_view text) {
    const std::string what = "size '" + std::string(text) + "'";
    size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) i++;
    if (i == 0) return Status::invalid_argument(what + ": expected a number with an optional unit (32GiB, 141GB)");
    double value = 0;
    try {
        size_t used = 0;
        value = std::stod(std::string(text.substr(0, i)), &used);
        if (used != i) throw std::invalid_argument("partial");
    } catch (const std::exception &) {
        return Status::invalid_argument(what + ": not a number");
    }
    std::string unit;
    for (char ch : text.substr(i))
        if (ch != ' ') unit += char(std::tolower(static_cast<unsigned char>(ch)));
    double mult = 0;
    if (unit.empty() || unit == "b") mult = 1;
    else if (unit == "kb") mult = 1e3;
    else if (unit == "mb") mult = 1e6;
    else if (unit == "gb") mult = 1e9;
    else if (unit == "tb") mult = 1e12;
    else if (unit == "kib") mult = 1024.0;
    else if (unit == "mib") mult = 1024.0 * 1024;
    else if (unit == "gib") mult = 1024.0 * 1024 * 1024;
    else if (unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
    else return Status::invalid_argument(what + ": unknown unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)");
    const double bytes = std::floor(value * mult);
    if (!(bytes >= 0) || bytes > 1.8e19) return Status::invalid_argument(what + ": out of range");
    return uint64_t(bytes);
}

std::string format_size(uint64_t bytes) {
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) return std::to_string(bytes) + " B";
    double v = double(bytes) / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        u++;
    }
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
    return buf;
}

std::string format_gib(uint64_t bytes) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
    return buf;
}

}  // namespace ds41rt::dist
