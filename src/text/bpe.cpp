// The symbols of a piece form a doubly linked list over an array; candidate merges sit in a
// binary min-heap keyed by (rank, position). A popped candidate is stale when its left symbol was
// merged away or its pair no longer yields the recorded token; it is then skipped, as in HF.
#include "text/bpe.h"

#include <algorithm>
#include <cstring>

namespace ds41rt::text {

namespace {

struct symbol {
    int32_t id;
    int32_t prev;   // -1 at the start
    int32_t next;   // -1 at the end
    bool alive;
};

struct candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
};

// std::push_heap builds a max-heap, so "less" means "pops later": larger rank, then larger pos.
bool pops_later(const candidate &a, const candidate &b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

struct scratch {
    std::vector<symbol> symbols;
    std::vector<candidate> heap;
};

}  // namespace

bpe_merges::bpe_merges(const int32_t (&byte_ids)[256]) {
    std::memcpy(byte_ids_, byte_ids, sizeof(byte_ids_));
    slots_.resize(1 << 10);
    mask_ = slots_.size() - 1;
}

void bpe_merges::grow() {
    std::vector<slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, slot{});
    mask_ = slots_.size() - 1;
    for (const slot &s : old) {
        if (s.key == EMPTY) continue;
        size_t i = mix(s.key) & mask_;
        while (slots_[i].key != EMPTY) i = (i + 1) & mask_;
        slots_[i] = s;
    }
}

void bpe_merges::add(int32_t left, int32_t right, int32_t rank, int32_t merged) {
    if ((n_ + 1) * 2 > slots_.size()) grow();  // load factor <= 1/2 keeps probes short
    uint64_t k = key(left, right);
    size_t i = mix(k) & mask_;
    while (slots_[i].key != EMPTY && slots_[i].key != k) i = (i + 1) & mask_;
    if (slots_[i].key == EMPTY) ++n_;
    // A repeated pair keeps its last rank, as HF's merge map does (it collects the list in order).
    slots_[i] = {k, rank, merged};
}

void bpe_merges::encode_piece(std::string_view piece, std::vector<int32_t> *out) const {
    const size_t n = piece.size();
    if (n == 1) {
        out->push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
        return;
    }
    thread_local scratch tls;
    std::vector<symbol> &sym = tls.symbols;
    std::vector<candidate> &heap = tls.heap;
    sym.resize(n);
    heap.clear();
    for (size_t i = 0; i < n; ++i) {
        sym[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], int32_t(i) - 1,
                  i + 1 < n ? int32_t(i + 1) : -1, true};
    }
    for (size_t i = 0; i + 1 < n; ++i) {
        if (const slot *m = find(sym[i].id, sym[i + 1].id)) {
            heap.push_back({m->rank, int32_t(i), m->merged});
        }
    }
    std::make_heap(heap.begin(), heap.end(), pops_later);

    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), pops_later);
        const candidate top = heap.back();
        heap.pop_back();
        symbol &left = sym[top.pos];
        if (!left.alive || left.next < 0) continue;
        symbol &right = sym[left.next];
        const slot *m = find(left.id, right.id);
        if (!m || m->merged != top.merged) continue;

        left.id = top.merged;
        right.alive = false;
        left.next = right.next;
        if (right.next >= 0) sym[right.next].prev = top.pos;

        if (left.prev >= 0) {
            if (const slot *mp = find(sym[left.prev].id, left.id)) {
                heap.push_back({mp->rank, left.prev, mp->merged});
                std::push_heap(heap.begin(), heap.end(), pops_later);
            }
        }
        if (left.next >= 0) {
            if (const slot *mn = find(left.id, sym[left.next].id)) {
                heap.push_back({mn->rank, top.pos, mn->merged});
                std::push_heap(heap.begin(), heap.end(), pops_later);
            }
        }
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

}  // namespace ds41rt::text
