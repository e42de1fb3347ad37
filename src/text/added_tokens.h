// Finds added tokens (<｜User｜>, <think>, ...) in raw text before pre-tokenization.
//
// HF scans for added tokens leftmost-longest: the earliest position where any token starts wins,
// and there the longest token. It scans twice, first for tokens with normalized=false over the
// whole text, then for normalized=true tokens inside the gaps; tokenizer.cpp keeps one matcher
// per pass. Immutable after construction, so concurrent finds are safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ds41rt::text {

class added_token_matcher {
public:
    added_token_matcher();

    void add(std::string_view content, int32_t id);
    bool empty() const { return n_tokens_ == 0; }

    struct match {
        size_t begin;
        size_t length;
        int32_t id;
    };
    // The leftmost-longest match starting at or after `from`; false when there is none.
    bool find(std::string_view text, size_t from, match *m) const;

private:
    // A byte trie: the root's children are a direct table (it is consulted at every byte of the
    // text), deeper nodes keep short sorted edge lists.
    struct node {
        int32_t id = -1;  // token ending here
        std::vector<std::pair<uint8_t, int32_t>> edges;
    };
    int32_t child(int32_t node_index, uint8_t b) const;

    std::vector<node> nodes_;
    int32_t root_edges_[256];
    size_t n_tokens_ = 0;
};

}  // namespace ds41rt::text
