// OpenAI-shaped errors: a Status (or an HTTP-level refusal) to the status code and the body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
//
// The mapping from Status codes is made once, here (STYLE convention 11): INVALID_ARGUMENT and
// EXCEEDS_CONTEXT 400, NOT_FOUND 404, NOT_SUPPORTED 501, RESOURCE_EXHAUSTED 429 (the queue is
// full; the caller adds Retry-After), UNAVAILABLE 503 (an expert worker did not answer, the
// reason in the message), everything else 500. A request-parsing Status names the offending
// field first ("temperature: must be in [0, 2]"); that name becomes "param".
//
// Threading: pure functions.
#pragma once

#include <string>

#include "core/status.h"

namespace ds41rt::server {

struct api_error {
    int http_status = 500;
    std::string type;     // invalid_request_error, not_found_error, rate_limit_error, server_error, ...
    std::string code;     // "" -> null
    std::string param;    // "" -> null
    std::string message;
};

api_error error_from_status(const Status &st);
api_error make_error(int http_status, std::string type, std::string code, std::string message, std::string param = {});

// The JSON body text (always valid UTF-8: invalid bytes in the message are replaced).
std::string error_body(const api_error &e);

}  // namespace ds41rt::server
