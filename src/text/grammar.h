// Grammar-constrained decoding: XGrammar (mlc-ai) behind a small interface.
//
// Three pieces, in the order they are used:
//  - grammar_compiler: one per served vocabulary. It holds XGrammar's TokenizerInfo (the decoded
//    bytes of every token id, built once) and its GrammarCompiler, whose thread-safe cache keys
//    compiled grammars by their source (the same schema or tool set compiles once).
//  - grammar: a compiled constraint, immutable and shared by every request that asks for it.
//  - grammar_matcher: one per sequence. It says which tokens may come next (a bitmask of 32-bit
//    words, bit i of word i/32 set when token i is allowed), accepts the sampled token, reports
//    termination, and can roll back accepted tokens (speculative drafts).
//
// The vocabulary is seen as raw bytes: token_bytes() of our byte-level BPE is already decoded,
// so XGrammar's RAW vocab type applies. Tokens the tokenizer marks special (BOS, pad, reserved
// placeholders) are never allowed; the stop tokens (EOS) are allowed exactly where the grammar
// may end, and accepting one terminates the matcher. Ids past the tokenizer's vocabulary (the
// model's logits may be wider) are never allowed.
//
// Errors: a schema or grammar XGrammar cannot compile is INVALID_ARGUMENT with its message;
// nothing here throws.
//
// Threading: a grammar_compiler may be used from many threads at once; a grammar is immutable; a
// grammar_matcher belongs to one sequence and is used from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/tokenizer.h"

namespace ds41rt::text {

class grammar;
class grammar_matcher;

// JSON Schema keywords XGrammar would silently ignore (so a schema using them would not be
// enforced): not, if/then/else, dependentRequired, dependentSchemas, uniqueItems, contains,
// minContains, maxContains. INVALID_ARGUMENT naming `field` and the keyword's path; property
// names that happen to spell a keyword are not keywords.
Status check_json_schema_support(const nlohmann::ordered_json &schema, const std::string &field);

// Words of a token bitmask over `vocab_size` ids.
inline int32_t grammar_mask_words(int32_t vocab_size) { return (vocab_size + 31) / 32; }

inline bool grammar_mask_allows(std::span<const uint32_t> mask, int32_t token) {
    return (mask[size_t(token) >> 5] >> (uint32_t(token) & 31u)) & 1u;
}

class grammar_compiler {
public:
    // vocab_size: the width of the model's logits; stop_tokens: the ids that end generation (the
    // model's EOS). Building the token table takes a moment on a real vocabulary: build one per
    // server.
    static Result<std::unique_ptr<grammar_compiler>> create(const tokenizer &tok, int32_t vocab_size,
                                                            std::vector<int32_t> stop_tokens);
    ~grammar_compiler();

    grammar_compiler(const grammar_compiler &) = delete;
    grammar_compiler &operator=(const grammar_compiler &) = delete;

    // Any JSON value whose top level is an object (OpenAI's json_object).
    Result<std::shared_ptr<const grammar>> json_object();
    // A JSON value valid under `schema_json` (a JSON Schema document as text), written compactly
    // (separators "," and ":", no whitespace between tokens: free whitespace would let a model
    // pad forever). strict: no properties beyond those listed where the schema leaves it open.
    Result<std::shared_ptr<const grammar>> json_schema(const std::string &schema_json, bool strict);
    // An XGrammar structural tag (JSON text, {"type": "structural_tag", "format": {...}}); an
    // error names `field` (the request field the tag came from).
    Result<std::shared_ptr<const grammar>> structural_tag(const std::string &tag_json, const char *field = "tools");
    // A GBNF/EBNF grammar with root rule "root" (tests and future extensions).
    Result<std::shared_ptr<const grammar>> ebnf(const std::string &ebnf);

    int32_t vocab_size() const;

private:
    struct impl;
    explicit grammar_compiler(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

class grammar_matcher {
public:
    // max_rollback: how many accepted tokens rollback() may undo (-1: unbounded).
    explicit grammar_matcher(std::shared_ptr<const grammar> g, int32_t max_rollback = 0);
    ~grammar_matcher();
    grammar_matcher(grammar_matcher &&) noexcept;
    grammar_matcher &operator=(grammar_matcher &&) noexcept;

    int32_t vocab_size() const;
    // Fills `mask` (grammar_mask_words(vocab_size()) words) with the tokens allowed next.
    void fill_mask(std::span<uint32_t> mask);
    // Accepts `token`; false (state unchanged) when the grammar does not allow it.
    bool accept(int32_t token);
    // A stop token was accepted: nothing may follow.
    bool terminated() const;
    // The output so far is a complete sentence (a stop token would be accepted now).
    bool can_end() const;
    // Undoes the last n accepted tokens (n <= max_rollback).
    void rollback(int32_t n);

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace ds41rt::text
