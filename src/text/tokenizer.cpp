// Loading checks the tokenizer.json layout field by field, then builds four tables: the BPE merge
// map, the two added-token matchers (one per HF pass), id -> spelling and id -> bytes. Encoding
// is: added tokens -> pre-tokenizer pieces -> word cache or BPE merges.
#include "text/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/pre_tokenizer.h"
#include "text/utf8.h"
#include "text/word_cache.h"

namespace ds41rt::text {

namespace {

using json = nlohmann::json;

bool is_null_or(const json &j, const char *key, const json &ok) {
    return !j.contains(key) || j[key].is_null() || j[key] == ok;
}

}  // namespace

struct tokenizer::impl {
    std::vector<std::string> pieces;     // [vocab_size] spelling; "" where no token has the id
    std::vector<std::string> bytes;      // [vocab_size] raw bytes
    std::vector<uint8_t> kind;           // [vocab_size] KIND_* bits
    std::unordered_map<std::string, int32_t> piece_to_id;  // BPE vocabulary and added tokens
    std::unique_ptr<bpe_merges> merges;
    added_token_matcher raw_added;         // normalized=false: HF's first pass
    added_token_matcher normalized_added;  // normalized=true: HF's second pass (no normalizer here)
    size_t n_added = 0;
    pre_tokenizer_kind pre_kind = pre_tokenizer_kind::DEEPSEEK;

    word_cache cache;

    enum : uint8_t { KIND_PRESENT = 1, KIND_ADDED = 2, KIND_SPECIAL = 4 };

    void encode_words(std::string_view text, std::vector<int32_t> *ids) const;
    void encode_normalized_pass(std::string_view text, std::vector<int32_t> *ids) const;
};

void tokenizer::impl::encode_words(std::string_view text, std::vector<int32_t> *ids) const {
    if (text.empty()) return;
    thread_local std::vector<std::string_view> words;
    words.clear();
    pre_tokenize(text, &words, pre_kind);
    for (std::string_view w : words) {
        if (w.size() == 1 || w.size() > word_cache::MAX_PIECE) {
            merges->encode_piece(w, ids);
            continue;
        }
        if (cache.lookup(w, ids)) continue;
        size_t before = ids->size();
        merges->encode_piece(w, ids);
        cache.insert(w, ids->data() + before, ids->size() - before);
    }
}

void tokenizer::impl::encode_normalized_pass(std::string_view text, std::vector<int32_t> *ids) const {
    size_t pos = 0;
    added_token_matcher::match m;
    while (normalized_added.find(text, pos, &m)) {
        encode_words(text.substr(pos, m.begin - pos), ids);
        ids->push_back(m.id);
        pos = m.begin + m.length;
    }
    encode_words(text.substr(pos), ids);
}

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer &&) noexcept = default;
tokenizer &tokenizer::operator=(tokenizer &&) noexcept = default;
tokenizer::~tokenizer() = default;

Result<tokenizer> tokenizer::load(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::not_found("tokenizer: cannot open " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    if (!f && !f.eof()) return Status::io_error("tokenizer: read failed: " + path);
    return parse(ss.str(), path);
}

Result<tokenizer> tokenizer::parse(std::string_view json_text, const std::string &origin) {
    json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
        return Status::corruption("tokenizer: " + origin + " is not a JSON object");
    auto unsupported = [&](const std::string &what) {
        return Status::not_supported("tokenizer: " + origin + ": " + what);
    };
    auto corrupt = [&](const std::string &what) {
        return Status::corruption("tokenizer: " + origin + ": " + what);
    };

    // Layout checks: everything this implementation assumes, named when it does not hold.
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
        const json &n = j["normalizer"];
        bool empty_seq = n.is_object() && n.value("type", "") == "Sequence" && n.contains("normalizers") &&
                         n["normalizers"].is_array() && n["normalizers"].empty();
        if (!empty_seq) return unsupported("normalizer " + n.dump() + " (only none is supported)");
    }
    std::string why;
    pre_tokenizer_kind pre_kind = pre_tokenizer_kind::DEEPSEEK;
    if (!j.contains("pre_tokenizer") || !pre_tokenizer_kind_of(j["pre_tokenizer"], &pre_kind, &why))
        return unsupported("pre_tokenizer: " + (why.empty() ? std::string("missing") : why));
    if (!j.contains("decoder") || !j["decoder"].is_object() || j["decoder"].value("type", "") != "ByteLevel")
        return unsupported("decoder must be ByteLevel");
    // A TemplateProcessing whose single-sequence template is just the sequence adds nothing.
    auto adds_nothing = [](const json &pp) {
        return pp.value("type", "") == "TemplateProcessing" && pp.contains("single") && pp["single"].is_array() &&
               pp["single"].size() == 1 && pp["single"][0].contains("Sequence");
    };
    if (j.contains("post_processor") && !j["post_processor"].is_null() &&
        j["post_processor"].value("type", "") != "ByteLevel" && !adds_nothing(j["post_processor"]))
        return unsupported("post_processor " + j["post_processor"].value("type", std::string("?")) +
                           " would add tokens (only ByteLevel or none is supported)");
    if (!j.contains("model") || !j["model"].is_object()) return corrupt("no model");
    const json &model = j["model"];
    if (model.value("type", "") != "BPE") return unsupported("model.type must be BPE");
    if (!is_null_or(model, "dropout", json()) || !is_null_or(model, "unk_token", json()) ||
        !is_null_or(model, "continuing_subword_prefix", "") || !is_null_or(model, "end_of_word_suffix", "") ||
        !is_null_or(model, "byte_fallback", false) || !is_null_or(model, "ignore_merges", false))
        return unsupported("model options (dropout, unk_token, subword affixes, byte_fallback, "
                           "ignore_merges) must be unset");
    if (!model.contains("vocab") || !model["vocab"].is_object()) return corrupt("model.vocab missing");
    if (!model.contains("merges") || !model["merges"].is_array()) return corrupt("model.merges missing");

    auto p = std::make_unique<impl>();
    p->pre_kind = pre_kind;
    const json &vocab = model["vocab"];
    const json added = j.value("added_tokens", json::array());
    if (!added.is_array()) return corrupt("added_tokens is not an array");

    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
        if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (1 << 30))
            return corrupt("model.vocab[" + json(it.key()).dump() + "] is not a valid id");
        max_id = std::max(max_id, it.value().get<int64_t>());
    }
    for (const json &a : added) {
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
            !a["content"].is_string() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= (1 << 30))
            return corrupt("added_tokens entry " + a.dump() + " needs an integer id and a string content");
        max_id = std::max(max_id, a["id"].get<int64_t>());
    }
    const size_t n_ids = size_t(max_id + 1);
    p->pieces.resize(n_ids);
    p->bytes.resize(n_ids);
    p->kind.assign(n_ids, 0);

    // HF decodes a token through the byte-level alphabet when every character is in it, and as
    // its own UTF-8 otherwise (<｜User｜> has characters outside the alphabet).
    auto set_token = [&](int32_t id, const std::string &spelled) {
        p->pieces[id] = spelled;
        if (!byte_level_to_bytes(spelled, &p->bytes[id])) p->bytes[id] = spelled;
        p->kind[id] |= impl::KIND_PRESENT;
    };
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
        int32_t id = it.value().get<int32_t>();
        if (p->kind[id] & impl::KIND_PRESENT) return corrupt("model.vocab id " + std::to_string(id) + " repeats");
        set_token(id, it.key());
        p->piece_to_id.emplace(it.key(), id);
    }

    int32_t byte_ids[256];
    for (int b = 0; b < 256; ++b) {
        std::string spelled = bytes_to_byte_level(std::string(1, char(b)));
        auto it = p->piece_to_id.find(spelled);
        if (it == p->piece_to_id.end())
            return unsupported("model.vocab lacks the single-byte token for byte " + std::to_string(b) +
                               " (byte-level BPE needs all 256)");
        byte_ids[b] = it->second;
    }

    p->merges = std::make_unique<bpe_merges>(byte_ids);
    const json &merges = model["merges"];
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const json &m = merges[rank];
        std::string left, right;
        if (m.is_string()) {
            const std::string &s = m.get_ref<const std::string &>();
            size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                return corrupt("model.merges[" + std::to_string(rank) + "] " + json(s).dump() + " is not \"A B\"");
            left = s.substr(0, sp);
            right = s.substr(sp + 1);
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            left = m[0].get<std::string>();
            right = m[1].get<std::string>();
        } else {
            return corrupt("model.merges[" + std::to_string(rank) + "] is neither \"A B\" nor [A, B]");
        }
        auto l = p->piece_to_id.find(left), r = p->piece_to_id.find(right), lr = p->piece_to_id.find(left + right);
        if (l == p->piece_to_id.end() || r == p->piece_to_id.end() || lr == p->piece_to_id.end())
            return corrupt("model.merges[" + std::to_string(rank) + "] " + json(left + " " + right).dump() +
                           " names a token missing from model.vocab");
        p->merges->add(l->second, r->second, int32_t(rank), lr->second);
    }

    for (const json &a : added) {
        if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
            return unsupported("added token " + a["content"].dump() + " uses lstrip/rstrip/single_word");
        int32_t id = a["id"].get<int32_t>();
        std::string content = a["content"].get<std::string>();
        if (content.empty()) return corrupt("added token " + std::to_string(id) + " is empty");
        set_token(id, content);
        p->kind[id] |= impl::KIND_ADDED;
        if (a.value("special", false)) p->kind[id] |= impl::KIND_SPECIAL;
        // An added token's spelling wins over a BPE token of the same spelling, as in HF.
        p->piece_to_id[content] = id;
        (a.value("normalized", false) ? p->normalized_added : p->raw_added).add(content, id);
        ++p->n_added;
    }
    return tokenizer(std::move(p));
}

void tokenizer::encode_append(std::string_view text, bool allow_special, std::vector<int32_t> *ids) const {
    if (!allow_special) {
        impl_->encode_words(text, ids);
        return;
    }
    size_t pos = 0;
    added_token_matcher::match m;
    while (impl_->raw_added.find(text, pos, &m)) {
        impl_->encode_normalized_pass(text.substr(pos, m.begin - pos), ids);
        ids->push_back(m.id);
        pos = m.begin + m.length;
    }
    impl_->encode_normalized_pass(text.substr(pos), ids);
}

std::vector<int32_t> tokenizer::encode(std::string_view text, bool allow_special) const {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    encode_append(text, allow_special, &ids);
    return ids;
}

std::string tokenizer::decode_bytes(std::span<const int32_t> ids, bool skip_special) const {
    std::string out;
    for (int32_t id : ids) {
        if (id < 0 || size_t(id) >= impl_->kind.size()) continue;
        uint8_t k = impl_->kind[id];
        if (!(k & impl::KIND_PRESENT) || (skip_special && (k & impl::KIND_SPECIAL))) continue;
        out += impl_->bytes[id];
    }
    return out;
}

std::string tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    return utf8_lossy(decode_bytes(ids, skip_special));
}

int32_t tokenizer::token_id(std::string_view piece) const {
    auto it = impl_->piece_to_id.find(std::string(piece));
    return it == impl_->piece_to_id.end() ? -1 : it->second;
}

std::string_view tokenizer::piece(int32_t id) const {
    return id >= 0 && size_t(id) < impl_->pieces.size() ? std::string_view(impl_->pieces[id]) : std::string_view();
}

std::string_view tokenizer::token_bytes(int32_t id) const {
    return id >= 0 && size_t(id) < impl_->bytes.size() ? std::string_view(impl_->bytes[id]) : std::string_view();
}

bool tokenizer::is_added(int32_t id) const {
    return id >= 0 && size_t(id) < impl_->kind.size() && (impl_->kind[id] & impl::KIND_ADDED);
}

bool tokenizer::is_special(int32_t id) const {
    return id >= 0 && size_t(id) < impl_->kind.size() && (impl_->kind[id] & impl::KIND_SPECIAL);
}

int32_t tokenizer::vocab_size() const { return int32_t(impl_->kind.size()); }
size_t tokenizer::n_merges() const { return impl_->merges->size(); }
size_t tokenizer::n_added_tokens() const { return impl_->n_added; }

}  // namespace ds41rt::text
