// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it.
//
// DeepSeek's prompt encoders are Python: tool schemas, non-string tool-call arguments and
// response-format schemas reach the prompt through json.dumps with its default separators
// (", " and ": "), key order as received, non-ASCII characters unescaped and floats in repr()
// form. The model was trained on those bytes, so the C++ encoder must reproduce them; nlohmann's
// dump() differs in separators and float spelling. Callers keep key order by parsing into
// nlohmann::ordered_json.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ds41rt::text {

// Serialize `v` the way Python's json.dumps(v, ensure_ascii=False) would.
std::string py_json_dumps(const nlohmann::ordered_json &v);

// Append the JSON string literal of `s` (quotes included) with Python's escaping rules.
// `s` must be valid UTF-8 (it is copied byte for byte apart from the escapes).
void py_json_append_string(std::string &out, std::string_view s);

}  // namespace ds41rt::text
