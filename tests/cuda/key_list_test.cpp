// Device-written attention key lists (backend/cuda/key_list) against the host's own construction
// of the same lists (engine/cuda key_lists' host path). Pointers are integers, so the comparison
// is exact; the whole key array is poisoned with 0xff bytes first.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "backend/cuda/key_list.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using testing_util::dev_vec;

namespace {

class CudaKeyList : public testing_util::CudaOps {};

// fill_key_rows against the host's construction of whole lists (engine/cuda key_lists' host
// path, written out here): the ring rows a row sees that still hold their position, the chunk's
// rows, nulls to the pad, the picks, nulls after. Sequences cover a full ring, a short history, a
// prefill longer than the ring, a ring whose oldest slots hold positions of a rolled-back future
// (lo past the first position seen), picks after a host-built window (tail off: those columns keep
// the poison), a gap between sequences, more sequences than one launch takes, and picks from
// fp32 rows and from packed records, contiguous or paged (a page table, pages of 5 records in
// reverse order, as engine/cuda paged_rows keeps a sequence's entries), rings of either kind
// (tagged pointers, cache_pack key_rows_ref).
TEST_F(CudaKeyList, RowsEqualTheHostsListsWholeOrAroundHostColumns) {
    using backend::cuda::key_row_seq;
    const int64_t W = 8, hd = 4, L = 40;
    struct seq_case {
        int64_t p0, n, lo, pad;
        int k;
        bool window;
    };
    std::vector<seq_case> cases = {{20, 1, 13, 8, 5, true}, {3, 2, 0, 8, 0, true},  {0, 12, 0, 8, 3, true},
                                   {30, 3, 26, 8, 4, true}, {9, 1, 2, 8, 0, false}, {17, 2, 10, 8, 6, true}};
    for (int i = 0; i < 16; i++) cases.push_back({int64_t(40 + i), 1, int64_t(40 + i - 7), 8, i % 3, true});
    std::mt19937 rng(11);
    std::vector<std::unique_ptr<dev_vec<float>>> rings, chunks;
    std::vector<std::vector<int64_t>> pos;
    std::vector<key_row_seq> seqs;
    std::vector<std::vector<int32_t>> idx_h, cnt_h;
    std::vector<std::unique_ptr<dev_vec<int32_t>>> idx_d, cnt_d;
    dev_vec<float> entries(size_t(64 * hd));
    const int64_t PR = 5, NP = 13;  // paged records: 13 pages of 5, page g at page NP - 1 - g of the buffer
    dev_vec<uint8_t> records(size_t(PR * NP * 288));
    std::vector<const uint8_t *> table_h;
    for (int64_t g = 0; g < NP; g++) table_h.push_back(records.p + (NP - 1 - g) * PR * 288);
    dev_vec<const uint8_t *> table(table_h);
    auto entry_ref = [&](size_t c) {
        backend::cuda::key_rows_ref r{records.p, 288, backend::cuda::key_format::FP4_E4M3_16};
        if (c % 4 == 3) r.base = nullptr, r.pages = table.p, r.page_rows = PR;
        return c % 2 ? r : backend::cuda::f32_key_rows(entries.p, hd);
    };
    auto ring_ref = [&](size_t c) {
        return c % 3 == 2 ? backend::cuda::key_rows_ref{reinterpret_cast<const uint8_t *>(rings[c]->p), 528,
                                                        backend::cuda::key_format::FP8_UE8M0_32}
                          : backend::cuda::f32_key_rows(rings[c]->p, hd);
    };
    auto want_slot = [&](size_t c, int64_t slot) {
        const uint64_t base = uint64_t(reinterpret_cast<uintptr_t>(rings[c]->p));
        return c % 3 == 2 ? (base + uint64_t(slot) * 528u) | 1u : base + uint64_t(slot * hd) * 4u;
    };
    // The pointer the kernel must write, formed here from integers.
    auto want_entry = [&](size_t c, int64_t e) {
        const uint64_t rec = uint64_t(reinterpret_cast<uintptr_t>(records.p));
        if (c % 4 == 3) return (rec + uint64_t((NP - 1 - e / PR) * PR + e % PR) * 288u) | 2u;
        return c % 2 ? (rec + uint64_t(e) * 288u) | 2u : uint64_t(reinterpret_cast<uintptr_t>(entries.p)) + uint64_t(e * hd) * 4u;
    };
    int64_t row = 0;
    for (size_t c = 0; c < cases.size(); c++) {
        const seq_case &q = cases[c];
        rings.push_back(std::make_unique<dev_vec<float>>(size_t(W * 528 / 4)));  // room for W records (pointers only)
        chunks.push_back(std::make_unique<dev_vec<float>>(size_t(q.n * hd)));
        // The ring holds [lo, p0) and, in the slots of older positions it could show, later ones.
        std::vector<int64_t> ps(size_t(W), -1);
        for (int64_t p = std::max<int64_t>(0, q.p0 - W); p < q.p0; p++) ps[size_t(p % W)] = p >= q.lo ? p : p + W;
        pos.push_back(ps);
        idx_h.emplace_back(size_t(q.n * q.k));
        cnt_h.emplace_back(size_t(q.n));
        for (auto &v : idx_h.back()) v = int32_t(rng() % 64);
        for (auto &v : cnt_h.back()) v = int32_t(rng() % (q.k + 1));
        idx_d.push_back(std::make_unique<dev_vec<int32_t>>(idx_h.back()));
        cnt_d.push_back(std::make_unique<dev_vec<int32_t>>(cnt_h.back()));
        if (c == 3) row += 2;  // two rows no sequence covers: a gap
        key_row_seq d;
        // Sequences 2, 5, 8 ... read their ring as FP8 records (pitch 528, tagged), the rest as fp32 rows.
        if (q.window) d.ring = ring_ref(c), d.chunk = chunks.back()->p;
        d.p0 = q.p0, d.lo = q.lo, d.o = row, d.n = q.n, d.pad = q.pad;
        // Odd sequences pick from packed records (pitch 288, tagged FP4; every other one paged),
        // even ones from fp32 rows.
        if (q.k) d.idx = idx_d.back()->p, d.cnt = cnt_d.back()->p, d.entries = entry_ref(c), d.k = q.k;
        seqs.push_back(d);
        row += q.n;
    }
    const int64_t R = row;
    for (bool tail : {true, false}) {
        dev_vec<uint64_t> keys(size_t(R * L));
        keys.poison();
        ASSERT_TRUE(backend::cuda::fill_key_rows(reinterpret_cast<const float **>(keys.p), L, seqs.data(), int(seqs.size()),
                                                 W, hd, tail, nullptr)
                        .is_ok());
        const std::vector<uint64_t> got = keys.download();
        std::vector<uint64_t> want(size_t(R * L), ~uint64_t(0));
        auto addr = [](const float *p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); };
        for (size_t c = 0; c < cases.size(); c++) {
            const seq_case &q = cases[c];
            const key_row_seq &d = seqs[c];
            for (int64_t s = 0; s < q.n; s++) {
                uint64_t *w = want.data() + (d.o + s) * L;
                std::vector<uint64_t> win;
                const int64_t p = q.p0 + s, first = std::max<int64_t>(0, p - W + 1);
                for (int64_t x = first; x < q.p0; x++)
                    if (pos[c][size_t(x % W)] == x) win.push_back(want_slot(c, x % W));
                for (int64_t x = std::max(first, q.p0); x <= p; x++) win.push_back(addr(chunks[c]->p + (x - q.p0) * hd));
                if (q.window)
                    for (int64_t j = 0; j < q.pad; j++) w[j] = j < int64_t(win.size()) ? win[size_t(j)] : 0;
                for (int j = 0; j < q.k; j++)
                    w[q.pad + j] = j < cnt_h[c][size_t(s)] ? want_entry(c, idx_h[c][size_t(s * q.k + j)]) : 0;
                if (tail)
                    for (int64_t j = q.pad + q.k; j < L; j++) w[j] = 0;
            }
        }
        size_t bad = 0;
        for (size_t i = 0; i < want.size(); i++)
            if (got[i] != want[i] && bad++ < 5)
                ADD_FAILURE() << "tail " << tail << " row " << i / L << " column " << i % L << ": " << std::hex << got[i]
                              << " vs " << want[i];
        EXPECT_EQ(bad, 0u);
        std::printf("    [key rows] %zu sequences, %lld rows, tail %d: %zu mismatches\n", cases.size(), (long long)R, int(tail),
                    bad);
    }
}

TEST_F(CudaKeyList, RefusesKeyRowsOutsideTheirLists) {
    backend::cuda::key_row_seq d;
    d.chunk = reinterpret_cast<const float *>(uintptr_t(256)), d.p0 = 20, d.lo = 13, d.n = 1, d.pad = 4;  // pad < W
    EXPECT_FALSE(backend::cuda::fill_key_rows(nullptr, 40, &d, 1, 8, 4, true, nullptr).is_ok());
    d.pad = 8, d.k = 40;  // past the list end
    EXPECT_FALSE(backend::cuda::fill_key_rows(nullptr, 40, &d, 1, 8, 4, true, nullptr).is_ok());
}

}  // namespace
