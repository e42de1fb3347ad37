// The text room's tokenizer: DeepSeek V3/V4-family byte-level BPE loaded from a HF tokenizer.json.
//
// encode reproduces HF tokenizers' Tokenizer.encode(text).ids for valid UTF-8 (added tokens are
// split out first, leftmost-longest; the rest goes through the three-regex pre-tokenizer and BPE
// merges). It also accepts bytes that are not UTF-8, which HF cannot take: those bytes match no
// split pattern and are spelled by their single-byte tokens. decode_bytes(encode(b)) == b for
// every byte string b: with allow_special false always, with true as long as every added token
// decodes to its own text (so for DeepSeek V4; tests/unit/tokenizer_test.cpp checks both).
//
// decode matches HF's decode (byte-level decoding, then invalid UTF-8 replaced by U+FFFD per
// maximal ill-formed subpart); decode_bytes returns the raw bytes so a stream can hold back an
// incomplete character (see utf8_incomplete_tail in text/utf8.h).
//
// Only the DeepSeek V3/V4 family layout is accepted (no normalizer, the known split sequence,
// ByteLevel decoder, plain BPE); anything else is NOT_SUPPORTED with the field named.
//
// Thread-safety: after load, every method is const and safe to call concurrently (the word cache
// inside is locked). Moving is cheap; the tables live behind one pointer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds41rt::text {

class tokenizer {
public:
    // Reads and checks a tokenizer.json; errors name the file and the offending field.
    static Result<tokenizer> load(const std::string &tokenizer_json_path);
    // The same from the file's text; `origin` names it in errors.
    static Result<tokenizer> parse(std::string_view json_text, const std::string &origin);

    tokenizer(tokenizer &&) noexcept;
    tokenizer &operator=(tokenizer &&) noexcept;
    ~tokenizer();

    // allow_special = true: added tokens in the text become their ids (HF behaviour; note that
    // DeepSeek marks <｜User｜> and friends special=false, yet HF still matches them).
    // allow_special = false: no added token is matched; the text is plain text, which is how
    // untrusted content should be encoded so it cannot forge role or control tokens.
    std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
    // Appends to *ids instead of returning a new vector.
    void encode_append(std::string_view text, bool allow_special, std::vector<int32_t> *ids) const;

    // Ids outside the vocabulary are skipped, as HF does; skip_special drops special=true tokens.
    std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
    std::string decode_bytes(std::span<const int32_t> ids, bool skip_special = false) const;

    // The id of a token spelled as in tokenizer.json ("Ġthe", "<｜User｜>"), or -1.
    int32_t token_id(std::string_view piece) const;
    // The token's spelling in tokenizer.json, or "" for an id outside the vocabulary.
    std::string_view piece(int32_t id) const;
    // The raw bytes the token stands for (what decode_bytes concatenates).
    std::string_view token_bytes(int32_t id) const;
    bool is_added(int32_t id) const;
    bool is_special(int32_t id) const;

    // One past the largest id (129,280 for DeepSeek V4: 128,000 BPE tokens plus added tokens).
    int32_t vocab_size() const;
    size_t n_merges() const;
    size_t n_added_tokens() const;

private:
    struct impl;
    explicit tokenizer(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

}  // namespace ds41rt::text
