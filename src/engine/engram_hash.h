// Engram n-gram hashing (V4.1, spec section 4.9): token ids -> per-layer table row ids.
//
// Pure integer math, computed once per position for all Engram layers. Each token is first
// mapped to its compressed class (a frozen table built offline from the tokenizer), then the
// n-grams ending at a position (2..max_ngram tokens, stopping at the sequence start and at DEAD
// positions) are hashed with per-layer odd multipliers and reduced modulo a prime per
// (n-gram size, head); offsets make every (n, head) bucket range disjoint inside a layer's table.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace ds41rt::engine {

class engram_hasher {
public:
    static constexpr int64_t DEAD = -1;

    // token_map: [vocab] compressed class per token id. multipliers: [n_engram_layers *
    // max_ngram] row-major; empty means "use the released model's values" (checked).
    static Result<engram_hasher> make(const model::model_config &c, std::vector<int64_t> token_map,
                                      std::vector<int64_t> multipliers);

    int n_cols() const { return (max_ngram_ - 1) * n_heads_; }
    int64_t compressed(int32_t token) const { return token_map_[size_t(token)]; }
    // Row ids for Engram layer k at position pos, given the compressed-id history (history[p]
    // for p <= pos; DEAD for image positions). out: [n_cols()].
    void hash(const std::vector<int64_t> &history, int64_t pos, int k, int64_t *out) const;

    // The tables hash() reads, for a device copy (backend/cuda engram_hash).
    const std::vector<int64_t> &primes() const { return primes_; }        // [layers][n-1][heads]
    const std::vector<int64_t> &offsets() const { return offsets_; }      // [layers][n-1][heads]
    const std::vector<int64_t> &multipliers() const { return multipliers_; }  // [layers][n]
    const std::vector<int64_t> &token_map() const { return token_map_; }  // [vocab]
    int64_t pad() const { return pad_; }
    int max_ngram() const { return max_ngram_; }
    int n_heads() const { return n_heads_; }
    int n_layers() const { return n_layers_; }

private:
    int max_ngram_ = 0, n_heads_ = 0, n_layers_ = 0;
    int64_t pad_ = 0;
    std::vector<int64_t> token_map_, multipliers_, primes_, offsets_;
};

}  // namespace ds41rt::engine
