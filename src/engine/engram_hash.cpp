#include "engine/engram_hash.h"

#include "model/engram_layout.h"

namespace ds41rt::engine {

namespace {

// Multipliers of the released V4.1 Flash (layers 1 and 14, compressed vocab 99,092), from
// numpy.random.default_rng(10007 * layer).integers(...) * 2 + 1 (spec section 4.9, two sources).
constexpr int64_t RELEASED_MULTIPLIERS[2][4] = {
    {76632096046245, 4839876093313, 35959672319349, 73987337458391},
    {67716810739261, 51510806800915, 30921347202721, 82619226485591},
};

}  // namespace

Result<engram_hasher> engram_hasher::make(const model::model_config &c, std::vector<int64_t> token_map,
                                          std::vector<int64_t> multipliers) {
    engram_hasher h;
    h.max_ngram_ = c.engram_max_ngram;
    h.n_heads_ = c.engram_n_heads;
    h.n_layers_ = int(c.engram_layer_ids.size());
    if (int64_t(token_map.size()) != c.vocab_size)
        return Status::invalid_argument("engram token map has " + std::to_string(token_map.size()) +
                                        " entries, vocab_size is " + std::to_string(c.vocab_size));
    if (multipliers.empty()) {
        bool released = c.engram_compressed_vocab_size == 99092 && c.engram_max_ngram == 4 &&
                        c.engram_layer_ids == std::vector<int>{1, 14};
        if (!released)
            return Status::invalid_argument(
                "engram hash multipliers are needed for this config (engram_token_map.safetensors: engram.multipliers)");
        for (auto &row : RELEASED_MULTIPLIERS) multipliers.insert(multipliers.end(), row, row + 4);
    }
    if (int64_t(multipliers.size()) != int64_t(h.n_layers_) * h.max_ngram_)
        return Status::invalid_argument("engram multipliers: expected " +
                                        std::to_string(h.n_layers_ * h.max_ngram_) + " values");
    for (int64_t v : token_map)
        if (v < 0 || v >= c.engram_compressed_vocab_size)
            return Status::invalid_argument("engram token map value " + std::to_string(v) +
                                            " outside the compressed vocabulary");
    h.token_map_ = std::move(token_map);
    h.multipliers_ = std::move(multipliers);
    h.pad_ = h.token_map_[size_t(c.engram_pad_id)];
    // Primes and offsets (model/engram_layout.h); offsets make every (n, head) range disjoint.
    h.primes_ = model::engram_primes(c.engram_vocab_size, h.n_layers_, h.max_ngram_, h.n_heads_);
    const size_t per_layer = size_t(h.max_ngram_ - 1) * size_t(h.n_heads_);
    for (int l = 0; l < h.n_layers_; l++) {
        int64_t total = 0, expected = c.engram_num_embeddings.at(size_t(l));
        for (size_t i = 0; i < per_layer; i++) {
            h.offsets_.push_back(total);
            total += h.primes_[size_t(l) * per_layer + i];
        }
        if (total != expected)
            return Status::invalid_argument("engram layer " + std::to_string(c.engram_layer_ids[size_t(l)]) +
                                            ": prime sum " + std::to_string(total) +
                                            " != engram_num_embeddings " + std::to_string(expected));
    }
    return h;
}

void engram_hasher::hash(const std::vector<int64_t> &history, int64_t pos, int k, int64_t *out) const {
    const int64_t *mult = multipliers_.data() + size_t(k) * size_t(max_ngram_);
    const size_t base = size_t(k) * size_t(n_cols());
    bool blocked = false;
    int64_t roll = 0;
    for (int s = 0; s < max_ngram_; s++) {
        int64_t src = pos - s >= 0 ? history[size_t(pos - s)] : DEAD;
        blocked = blocked || pos < s || src == DEAD;
        int64_t tok = blocked ? pad_ : src;
        int64_t prod = tok * mult[s];
        roll = s == 0 ? prod : (roll ^ prod);
        if (s == 0) continue;
        for (int hd = 0; hd < n_heads_; hd++) {
            size_t col = size_t(s - 1) * size_t(n_heads_) + size_t(hd);
            int64_t p = primes_[base + col];
            out[col] = roll % p + offsets_[base + col];
        }
    }
}

}  // namespace ds41rt::engine
