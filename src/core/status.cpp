#include "core/status.h"

namespace ds41rt {

const char *status_code_name(status_code c) {
    switch (c) {
    case status_code::OK: return "ok";
    case status_code::INVALID_ARGUMENT: return "invalid_argument";
    case status_code::NOT_FOUND: return "not_found";
    case status_code::CORRUPTION: return "corruption";
    case status_code::NOT_SUPPORTED: return "not_supported";
    case status_code::IO_ERROR: return "io_error";
    case status_code::UNAVAILABLE: return "unavailable";
    case status_code::RESOURCE_EXHAUSTED: return "resource_exhausted";
    case status_code::EXCEEDS_CONTEXT: return "exceeds_context";
    case status_code::INTERNAL: return "internal";
    }
    return "unknown";
}

std::string Status::to_string() const {
    if (is_ok()) return "ok";
    return std::string(status_code_name(code_)) + ": " + msg_;
}

void assert_fail(const char *cond, const char *file, int line, const char *msg) {
    std::fprintf(stderr, "ds41rt: assertion failed: %s at %s:%d%s%s\n", cond, file, line,
                 msg ? ": " : "", msg ? msg : "");
    std::abort();
}

}  // namespace ds41rt
