// Python json.dumps(ensure_ascii=False) compatible serialization (see py_json.h for why).
#include "text/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ds41rt::text {

namespace {

// Python's float.__repr__: the shortest digits that round-trip, in fixed notation when the
// decimal exponent is in [-4, 16), otherwise d.ddde+XX with at least two exponent digits.
void append_float(std::string &out, double v) {
    if (std::isnan(v)) { out += "NaN"; return; }
    if (std::isinf(v)) { out += v < 0 ? "-Infinity" : "Infinity"; return; }
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    std::string sci(buf, res.ptr);  // "[-]d[.ddd]e[+-]XX"
    bool neg = sci[0] == '-';
    if (neg) sci.erase(0, 1);
    size_t e_pos = sci.find('e');
    std::string digits = sci.substr(0, e_pos);
    int exp10 = std::atoi(sci.c_str() + e_pos + 1);
    if (size_t dot = digits.find('.'); dot != std::string::npos) digits.erase(dot, 1);
    if (neg) out += '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            out += "0.";
            out.append(static_cast<size_t>(-exp10 - 1), '0');
            out += digits;
        } else {
            size_t int_len = static_cast<size_t>(exp10) + 1;
            if (digits.size() <= int_len) {
                out += digits;
                out.append(int_len - digits.size(), '0');
                out += ".0";
            } else {
                out.append(digits, 0, int_len);
                out += '.';
                out.append(digits, int_len, std::string::npos);
            }
        }
    } else {
        out += digits[0];
        if (digits.size() > 1) {
            out += '.';
            out.append(digits, 1, std::string::npos);
        }
        char ebuf[16];
        std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
        out += ebuf;
    }
}

void append_value(std::string &out, const nlohmann::ordered_json &v) {
    using vt = nlohmann::ordered_json::value_t;
    switch (v.type()) {
    case vt::null: out += "null"; break;
    case vt::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case vt::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case vt::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case vt::number_float: append_float(out, v.get<double>()); break;
    case vt::string: py_json_append_string(out, v.get_ref<const std::string &>()); break;
    case vt::array: {
        out += '[';
        bool first = true;
        for (const auto &e : v) {
            if (!first) out += ", ";
            first = false;
            append_value(out, e);
        }
        out += ']';
        break;
    }
    case vt::object: {
        out += '{';
        bool first = true;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            py_json_append_string(out, it.key());
            out += ": ";
            append_value(out, it.value());
        }
        out += '}';
        break;
    }
    case vt::binary:
    case vt::discarded: out += "null"; break;
    }
}

}  // namespace

void py_json_append_string(std::string &out, std::string_view s) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out += buf;
            } else {
                out += static_cast<char>(c);
            }
        }
    }
    out += '"';
}

std::string py_json_dumps(const nlohmann::ordered_json &v) {
    std::string out;
    append_value(out, v);
    return out;
}

}  // namespace ds41rt::text
