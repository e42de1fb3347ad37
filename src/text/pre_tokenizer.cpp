// Each split pass is "find the leftmost match, emit the gap before it and the match, continue
// after it"; a match function returns the length of the match at a position or 0. The match
// functions are ordered like the alternatives of the regex, because a backtracking engine takes
// the first alternative that matches at the leftmost position, not the longest.
#include "text/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "text/unicode_class.h"

namespace ds41rt::text {

namespace {

struct ch {
    uint32_t cp;   // code point, UTF8_INVALID, or END past the subject
    uint8_t cls;   // unicode_class_bits
    uint8_t len;   // bytes (0 at the end)
};

constexpr uint32_t END = 0xFFFFFFFEu;

struct subject {
    const unsigned char *s;
    size_t n;
    const unicode_class_table &classes;

    ch at(size_t pos) const {
        if (pos >= n) return {END, 0, 0};
        if (s[pos] < 0x80) {
            uint32_t c = s[pos];
            return {c, ASCII_CLASSES.cls[c], 1};
        }
        uint32_t cp;
        size_t len = utf8_step(s + pos, s + n, &cp);
        uint8_t cls = cp == UTF8_INVALID ? uint8_t(UCLASS_INVALID) : classes(cp);
        return {cp, cls, static_cast<uint8_t>(len)};
    }
};

template <class Match, class Emit>
void isolated_split(std::string_view text, Match &&match, Emit &&emit) {
    subject sub{reinterpret_cast<const unsigned char *>(text.data()), text.size(), unicode_class_lookup()};
    size_t gap = 0, p = 0;
    while (p < sub.n) {
        size_t m = match(sub, p);
        if (m == 0) {
            p += sub.at(p).len;
            continue;
        }
        if (p > gap) emit(text.substr(gap, p - gap));
        emit(text.substr(p, m));
        p += m;
        gap = p;
    }
    if (sub.n > gap) emit(text.substr(gap));
}

// \p{N}{1,3}
size_t match_digits(const subject &sub, size_t p) {
    size_t q = p;
    for (int k = 0; k < 3; ++k) {
        ch c = sub.at(q);
        if (!(c.cls & UCLASS_N)) break;
        q += c.len;
    }
    return q - p;
}

// [一-龥぀-ゟ゠-ヿ]+ (the file spells the ranges with literal characters)
bool is_cjk_kana(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF);
}

size_t match_cjk(const subject &sub, size_t p) {
    size_t q = p;
    for (ch c = sub.at(q); c.cp != END && is_cjk_kana(c.cp); c = sub.at(q)) q += c.len;
    return q - p;
}

bool is_ascii_punct(uint32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
}

bool is_ascii_alpha(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

bool is_cr_lf(uint32_t c) { return c == '\r' || c == '\n'; }

// The third regex, alternative by alternative.
size_t match_main(const subject &sub, size_t p) {
    const ch c0 = sub.at(p);

    // [!"#...~][A-Za-z]+
    if (is_ascii_punct(c0.cp)) {
        size_t q = p + 1;
        while (q < sub.n && is_ascii_alpha(sub.s[q])) ++q;
        if (q > p + 1) return q - p;
    }

    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : the optional char is tried first; a mark may serve as
    // either part, a letter only as the run.
    auto letter_run_end = [&](size_t q) {
        for (ch c = sub.at(q); c.cls & (UCLASS_L | UCLASS_M); c = sub.at(q)) q += c.len;
        return q;
    };
    constexpr uint8_t NOT_OPTIONAL = UCLASS_INVALID | UCLASS_L | UCLASS_P | UCLASS_S;
    if (c0.cp != END && !(c0.cls & NOT_OPTIONAL) && !is_cr_lf(c0.cp)) {
        size_t q = letter_run_end(p + c0.len);
        if (q > p + c0.len) return q - p;
    }
    if (c0.cls & (UCLASS_L | UCLASS_M)) return letter_run_end(p) - p;

    // ' '?[\p{P}\p{S}]+[\r\n]*
    {
        size_t q = p;
        if (c0.cp == ' ' && (sub.at(p + 1).cls & (UCLASS_P | UCLASS_S))) q = p + 1;
        if (sub.at(q).cls & (UCLASS_P | UCLASS_S)) {
            for (ch c = sub.at(q); c.cls & (UCLASS_P | UCLASS_S); c = sub.at(q)) q += c.len;
            while (q < sub.n && is_cr_lf(sub.s[q])) ++q;
            return q - p;
        }
    }

    if (!(c0.cls & UCLASS_WS)) return 0;
    size_t q = p, last_start = p, n_chars = 0, after_last_newline = 0;
    for (ch c = sub.at(q); c.cls & UCLASS_WS; c = sub.at(q)) {
        if (is_cr_lf(c.cp)) after_last_newline = q + 1;
        last_start = q;
        q += c.len;
        ++n_chars;
    }
    // \s*[\r\n]+ : the greedy \s* backs off to the last newline of the run.
    if (after_last_newline > 0) return after_last_newline - p;
    // \s+(?!\S) : whole run if nothing or an invalid byte follows, else the run less its last char.
    ch next = sub.at(q);
    if (next.cp == END || (next.cls & UCLASS_INVALID)) return q - p;
    if (n_chars >= 2) return last_start - p;
    // \s+
    return q - p;
}

// GPT-2's single regex (HF ByteLevel with use_regex=true), alternative by alternative.
size_t match_gpt2(const subject &sub, size_t p) {
    const ch c0 = sub.at(p);
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c0.cp == '\'') {
        static constexpr std::string_view SUFFIXES[] = {"s", "t", "re", "ve", "m", "ll", "d"};
        std::string_view rest(reinterpret_cast<const char *>(sub.s) + p + 1, sub.n - p - 1);
        for (std::string_view suf : SUFFIXES)
            if (rest.substr(0, suf.size()) == suf) return 1 + suf.size();
    }
    // ' ?X+' for X = letters, numbers, and "other" (not space, letter, number; invalid bytes match nothing).
    auto is_other = [](const ch &c) {
        return c.cp != END && !(c.cls & (UCLASS_WS | UCLASS_L | UCLASS_N | UCLASS_INVALID));
    };
    auto run = [&](auto &&pred) -> size_t {
        size_t q = p;
        if (c0.cp == ' ' && pred(sub.at(p + 1))) q = p + 1;
        if (!pred(sub.at(q))) return 0;
        for (ch c = sub.at(q); pred(c); c = sub.at(q)) q += c.len;
        return q - p;
    };
    if (size_t m = run([](const ch &c) { return (c.cls & UCLASS_L) != 0; })) return m;
    if (size_t m = run([](const ch &c) { return (c.cls & UCLASS_N) != 0; })) return m;
    if (size_t m = run(is_other)) return m;
    if (!(c0.cls & UCLASS_WS)) return 0;
    size_t q = p, last_start = p, n_chars = 0;
    for (ch c = sub.at(q); c.cls & UCLASS_WS; c = sub.at(q)) {
        last_start = q;
        q += c.len;
        ++n_chars;
    }
    // \s+(?!\S), else \s+
    ch next = sub.at(q);
    if (next.cp == END || (next.cls & UCLASS_INVALID)) return q - p;
    if (n_chars >= 2) return last_start - p;
    return q - p;
}

constexpr const char *PATTERN_DIGITS = "\\p{N}{1,3}";
constexpr const char *PATTERN_CJK = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+";
constexpr const char *PATTERN_MAIN =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

bool is_split(const nlohmann::json &j, const char *pattern, std::string *why) {
    if (!j.is_object() || j.value("type", "") != "Split") {
        *why = "expected a Split pre-tokenizer, got " + j.dump();
        return false;
    }
    const nlohmann::json &pat = j.value("pattern", nlohmann::json::object());
    if (!pat.contains("Regex") || pat["Regex"] != pattern) {
        *why = "Split pattern " + pat.dump() + " is not the DeepSeek V3/V4 pattern " +
               nlohmann::json(pattern).dump();
        return false;
    }
    if (j.value("behavior", "") != "Isolated" || j.value("invert", true)) {
        *why = "Split behavior must be Isolated and invert false: " + j.dump();
        return false;
    }
    return true;
}

}  // namespace

void pre_tokenize(std::string_view text, std::vector<std::string_view> *pieces, pre_tokenizer_kind kind) {
    if (kind == pre_tokenizer_kind::GPT2) {
        isolated_split(text, match_gpt2, [&](std::string_view piece) { pieces->push_back(piece); });
        return;
    }
    auto main_pass = [&](std::string_view s) {
        isolated_split(s, match_main, [&](std::string_view piece) { pieces->push_back(piece); });
    };
    auto cjk_pass = [&](std::string_view s) { isolated_split(s, match_cjk, main_pass); };
    isolated_split(text, match_digits, cjk_pass);
}

bool pre_tokenizer_is_deepseek(const nlohmann::json &pre, std::string *why) {
    if (!pre.is_object() || pre.value("type", "") != "Sequence" || !pre.contains("pretokenizers") ||
        !pre["pretokenizers"].is_array() || pre["pretokenizers"].size() != 4) {
        *why = "pre_tokenizer must be a Sequence of 3 Splits and ByteLevel";
        return false;
    }
    const nlohmann::json &seq = pre["pretokenizers"];
    if (!is_split(seq[0], PATTERN_DIGITS, why) || !is_split(seq[1], PATTERN_CJK, why) ||
        !is_split(seq[2], PATTERN_MAIN, why))
        return false;
    const nlohmann::json &bl = seq[3];
    if (!bl.is_object() || bl.value("type", "") != "ByteLevel" || bl.value("add_prefix_space", true) ||
        bl.value("use_regex", true)) {
        *why = "last pre-tokenizer must be ByteLevel without prefix space or regex: " + bl.dump();
        return false;
    }
    return true;
}

bool pre_tokenizer_kind_of(const nlohmann::json &pre, pre_tokenizer_kind *kind, std::string *why) {
    if (pre.is_object() && pre.value("type", "") == "ByteLevel") {
        if (pre.value("add_prefix_space", true) || !pre.value("use_regex", true)) {
            *why = "a lone ByteLevel pre-tokenizer must have use_regex true and add_prefix_space false: " + pre.dump();
            return false;
        }
        *kind = pre_tokenizer_kind::GPT2;
        return true;
    }
    *kind = pre_tokenizer_kind::DEEPSEEK;
    return pre_tokenizer_is_deepseek(pre, why);
}

}  // namespace ds41rt::text
