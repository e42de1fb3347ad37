#include "text/added_tokens.h"

#include <algorithm>

namespace ds41rt::text {

added_token_matcher::added_token_matcher() {
    nodes_.emplace_back();
    std::fill(std::begin(root_edges_), std::end(root_edges_), -1);
}

int32_t added_token_matcher::child(int32_t node_index, uint8_t b) const {
    if (node_index == 0) return root_edges_[b];
    const auto &edges = nodes_[node_index].edges;
    auto it = std::lower_bound(edges.begin(), edges.end(), std::pair<uint8_t, int32_t>(b, -1));
    return it != edges.end() && it->first == b ? it->second : -1;
}

void added_token_matcher::add(std::string_view content, int32_t id) {
    if (content.empty()) return;
    int32_t cur = 0;
    for (char c : content) {
        uint8_t b = static_cast<uint8_t>(c);
        int32_t next = child(cur, b);
        if (next < 0) {
            next = static_cast<int32_t>(nodes_.size());
            nodes_.emplace_back();
            if (cur == 0) {
                root_edges_[b] = next;
            } else {
                auto &edges = nodes_[cur].edges;
                edges.insert(std::lower_bound(edges.begin(), edges.end(), std::pair<uint8_t, int32_t>(b, -1)),
                             {b, next});
            }
        }
        cur = next;
    }
    if (nodes_[cur].id < 0) ++n_tokens_;
    nodes_[cur].id = id;
}

bool added_token_matcher::find(std::string_view text, size_t from, match *m) const {
    if (n_tokens_ == 0) return false;
    for (size_t start = from; start < text.size(); ++start) {
        int32_t cur = root_edges_[static_cast<uint8_t>(text[start])];
        size_t best_len = 0;
        int32_t best_id = -1;
        for (size_t i = start + 1; cur >= 0; ++i) {
            if (nodes_[cur].id >= 0) {
                best_len = i - start;
                best_id = nodes_[cur].id;
            }
            if (i >= text.size()) break;
            cur = child(cur, static_cast<uint8_t>(text[i]));
        }
        if (best_id >= 0) {
            *m = {start, best_len, best_id};
            return true;
        }
    }
    return false;
}

}  // namespace ds41rt::text
