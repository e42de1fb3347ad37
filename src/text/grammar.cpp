// XGrammar behind text/grammar.h. XGrammar reports errors by throwing; every call into it is
// wrapped here so that nothing crosses the room boundary as an exception.
#include "text/grammar.h"

#include <algorithm>
#include <thread>

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

namespace ds41rt::text {

class grammar {
public:
    explicit grammar(xgrammar::CompiledGrammar g, int32_t vocab_size) : compiled(std::move(g)), vocab(vocab_size) {}
    xgrammar::CompiledGrammar compiled;
    int32_t vocab;
};

namespace {

// Compiled grammars kept by XGrammar's cache: user schemas are unbounded, the cache is not.
constexpr int64_t COMPILER_CACHE_BYTES = 256ll << 20;

template <class F>
Result<std::shared_ptr<const grammar>> compile(F &&f, int32_t vocab, const char *what) {
    try {
        return std::make_shared<const grammar>(f(), vocab);
    } catch (const std::exception &e) {
        return Status::invalid_argument(std::string(what) + ": " + e.what());
    }
}

// Keys whose value maps names to subschemas (the names themselves are not keywords).
bool is_schema_map(const std::string &key) {
    return key == "properties" || key == "patternProperties" || key == "$defs" || key == "definitions" ||
           key == "dependentSchemas";
}

Status check_schema(const nlohmann::ordered_json &s, const std::string &path) {
    static const char *const unsupported[] = {"not", "if", "then", "else", "dependentRequired", "dependentSchemas",
                                              "uniqueItems", "contains", "minContains", "maxContains"};
    if (s.is_array()) {
        for (size_t i = 0; i < s.size(); i++) DS41RT_RETURN_IF_ERROR(check_schema(s[i], path + "[" + std::to_string(i) + "]"));
        return Status::ok();
    }
    if (!s.is_object()) return Status::ok();
    for (auto it = s.begin(); it != s.end(); ++it) {
        const std::string &k = it.key();
        for (const char *u : unsupported)
            if (k == u) return Status::invalid_argument(path + "." + k + ": this JSON Schema keyword is not supported");
        if (k == "enum" || k == "const" || k == "default" || k == "examples") continue;  // values, not schemas
        if (is_schema_map(k) && it.value().is_object()) {
            for (auto p = it.value().begin(); p != it.value().end(); ++p)
                DS41RT_RETURN_IF_ERROR(check_schema(p.value(), path + "." + k + "." + p.key()));
        } else {
            DS41RT_RETURN_IF_ERROR(check_schema(it.value(), path + "." + k));
        }
    }
    return Status::ok();
}

}  // namespace

Status check_json_schema_support(const nlohmann::ordered_json &schema, const std::string &field) {
    return check_schema(schema, field);
}

struct grammar_compiler::impl {
    xgrammar::TokenizerInfo info;
    xgrammar::GrammarCompiler compiler;
    int32_t vocab;

    impl(xgrammar::TokenizerInfo i, int32_t v)
        : info(std::move(i)),
          compiler(info, int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)), /*cache_enabled=*/true,
                   COMPILER_CACHE_BYTES),
          vocab(v) {}
};

grammar_compiler::grammar_compiler(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
grammar_compiler::~grammar_compiler() = default;

Result<std::unique_ptr<grammar_compiler>> grammar_compiler::create(const tokenizer &tok, int32_t vocab_size,
                                                                   std::vector<int32_t> stop_tokens) {
    // Ids the model cannot produce need no entry (a tokenizer may be larger than the model).
    const int32_t n = std::min(tok.vocab_size(), vocab_size);
    for (int32_t s : stop_tokens)
        if (s < 0 || s >= n) return Status::invalid_argument("grammar: stop token " + std::to_string(s) + " is outside the vocabulary");
    // An empty string is XGrammar's mark for a token that never matches text.
    std::vector<std::string> vocab(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; id++) {
        const bool stop = std::find(stop_tokens.begin(), stop_tokens.end(), id) != stop_tokens.end();
        if (stop || !tok.is_special(id)) vocab[size_t(id)] = std::string(tok.token_bytes(id));
    }
    try {
        xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, vocab_size, stop_tokens, /*add_prefix_space=*/false);
        return std::unique_ptr<grammar_compiler>(new grammar_compiler(std::make_unique<impl>(std::move(info), vocab_size)));
    } catch (const std::exception &e) {
        return Status::internal(std::string("grammar: building the token table failed: ") + e.what());
    }
}

int32_t grammar_compiler::vocab_size() const { return impl_->vocab; }

Result<std::shared_ptr<const grammar>> grammar_compiler::json_object() {
    return compile([&] {
        return impl_->compiler.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false, std::nullopt,
                                                 std::make_pair(std::string(","), std::string(":")), /*strict_mode=*/false);
    },
                   impl_->vocab, "response_format");
}

Result<std::shared_ptr<const grammar>> grammar_compiler::json_schema(const std::string &schema_json, bool strict) {
    // Compact separators: free whitespace lets a model pad forever without ever closing the value.
    return compile(
        [&] {
            return impl_->compiler.CompileJSONSchema(schema_json, /*any_whitespace=*/false, std::nullopt,
                                                     std::make_pair(std::string(","), std::string(":")), strict);
        },
        impl_->vocab, "response_format.json_schema.schema");
}

Result<std::shared_ptr<const grammar>> grammar_compiler::structural_tag(const std::string &tag_json, const char *field) {
    return compile([&] { return impl_->compiler.CompileStructuralTag(tag_json); }, impl_->vocab, field);
}

Result<std::shared_ptr<const grammar>> grammar_compiler::ebnf(const std::string &ebnf) {
    return compile([&] { return impl_->compiler.CompileGrammar(ebnf, "root"); }, impl_->vocab, "grammar");
}

struct grammar_matcher::impl {
    std::shared_ptr<const grammar> g;
    xgrammar::GrammarMatcher m;

    impl(std::shared_ptr<const grammar> gr, int32_t max_rollback)
        : g(std::move(gr)), m(g->compiled, std::nullopt, /*terminate_without_stop_token=*/false, max_rollback) {}
};

grammar_matcher::grammar_matcher(std::shared_ptr<const grammar> g, int32_t max_rollback)
    : impl_(std::make_unique<impl>(std::move(g), max_rollback)) {}
grammar_matcher::~grammar_matcher() = default;
grammar_matcher::grammar_matcher(grammar_matcher &&) noexcept = default;
grammar_matcher &grammar_matcher::operator=(grammar_matcher &&) noexcept = default;

int32_t grammar_matcher::vocab_size() const { return impl_->g->vocab; }

void grammar_matcher::fill_mask(std::span<uint32_t> mask) {
    int64_t shape[1] = {int64_t(mask.size())};
    DLTensor t{};
    t.data = mask.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = xgrammar::GetBitmaskDLType();
    t.shape = shape;
    t.strides = nullptr;
    t.byte_offset = 0;
    impl_->m.FillNextTokenBitmask(&t);
}

bool grammar_matcher::accept(int32_t token) {
    if (token < 0 || token >= impl_->g->vocab) return false;
    return impl_->m.AcceptToken(token);
}

bool grammar_matcher::terminated() const { return impl_->m.IsTerminated(); }
bool grammar_matcher::can_end() const { return impl_->m.IsCompleted(); }
void grammar_matcher::rollback(int32_t n) { impl_->m.Rollback(n); }

}  // namespace ds41rt::text
