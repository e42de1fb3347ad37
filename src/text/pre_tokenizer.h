// The DeepSeek V3/V4 pre-tokenizer: three regex splits, each keeping its matches as pieces
// ("Isolated"), applied in sequence; the pieces then go to byte-level BPE one at a time.
//
//   1. \p{N}{1,3}                         digit groups of at most three
//   2. [一-龥぀-ゟ゠-ヿ]+                 runs of CJK ideographs (U+4E00..9FA5), hiragana, katakana
//   3. [ASCII punct][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ | ' '?[\p{P}\p{S}]+[\r\n]*
//      | \s*[\r\n]+ | \s+(?!\S) | \s+
//
// The regexes are matched by hand (one function per alternative, written to reproduce Oniguruma's
// backtracking result) over a Unicode 16.0 class table, because HF matches them with Oniguruma
// at Unicode 16.0 and the system PCRE2 is Unicode 14. The loader only accepts a tokenizer.json
// whose pre_tokenizer is exactly this sequence (pre_tokenizer_is_deepseek).
//
// A second layout is accepted for the tiny test models (tests/fixtures/*/tokenizer.json): a lone
// ByteLevel pre-tokenizer with use_regex=true, i.e. GPT-2's split
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (PRE_TOKENIZER_GPT2), matched by hand the same way.
//
// Bytes that are not valid UTF-8 (HF cannot be given them at all) match no pattern item, not even
// a negated class, as with PCRE2's MATCH_INVALID_UTF: they end up in the gaps between matches.
// Stateless and thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ds41rt::text {

enum class pre_tokenizer_kind { DEEPSEEK = 0, GPT2 };

// Appends the pieces of `text` to *pieces; they tile `text` exactly, in order, none empty.
void pre_tokenize(std::string_view text, std::vector<std::string_view> *pieces,
                  pre_tokenizer_kind kind = pre_tokenizer_kind::DEEPSEEK);

// Which of the two accepted layouts a tokenizer.json "pre_tokenizer" object is; false (and *why)
// for anything else.
bool pre_tokenizer_kind_of(const nlohmann::json &pre, pre_tokenizer_kind *kind, std::string *why);

// True when a tokenizer.json "pre_tokenizer" object is the sequence above followed by
// ByteLevel(add_prefix_space=false, use_regex=false); otherwise *why says what differs.
bool pre_tokenizer_is_deepseek(const nlohmann::json &pre, std::string *why);

}  // namespace ds41rt::text
