// Status -> OpenAI error (see openai_errors.h).
#include "server/openai_errors.h"

#include <nlohmann/json.hpp>

namespace ds41rt::server {

namespace {

// "messages[2].content: missing" -> "messages[2].content"; "" when the message does not start
// with a field path.
std::string param_of(const std::string &msg) {
    size_t colon = msg.find(": ");
    if (colon == std::string::npos || colon == 0) return {};
    for (size_t i = 0; i < colon; i++) {
        char c = msg[i];
        if (!(isalnum((unsigned char)c) || c == '_' || c == '.' || c == '[' || c == ']')) return {};
    }
    return msg.substr(0, colon);
}

}  // namespace

api_error make_error(int http_status, std::string type, std::string code, std::string message, std::string param) {
    return {http_status, std::move(type), std::move(code), std::move(param), std::move(message)};
}

api_error error_from_status(const Status &st) {
    const std::string &m = st.message();
    switch (st.code()) {
    case status_code::INVALID_ARGUMENT:
        return make_error(400, "invalid_request_error", "invalid_value", m, param_of(m));
    case status_code::EXCEEDS_CONTEXT:
        return make_error(400, "invalid_request_error", "context_length_exceeded", m, "max_tokens");
    case status_code::NOT_FOUND: {
        std::string param = param_of(m);
        return make_error(404, "not_found_error", param == "model" ? "model_not_found" : "not_found", m, param);
    }
    case status_code::NOT_SUPPORTED:
        return make_error(501, "not_supported_error", "not_supported", m, param_of(m));
    case status_code::RESOURCE_EXHAUSTED: return make_error(429, "rate_limit_error", "queue_full", m);
    case status_code::UNAVAILABLE: return make_error(503, "server_error", "service_unavailable", m);
    default: return make_error(500, "server_error", "internal_error", m);
    }
}

std::string error_body(const api_error &e) {
    nlohmann::json j;
    j["error"]["message"] = e.message;
    j["error"]["type"] = e.type;
    j["error"]["param"] = e.param.empty() ? nlohmann::json() : nlohmann::json(e.param);
    j["error"]["code"] = e.code.empty() ? nlohmann::json() : nlohmann::json(e.code);
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ds41rt::server
