// GPU sparse attention (backend/cuda/attention) against the engine's attend_row
// (engine/attention_row.cpp, linked into this binary alone: it needs only core and backend/cpu),
// on random inputs at the fixture shapes (H 4, hd 64 and 40, 8 window + 4 compressed keys) and at
// V4.1's decode shape (H 64, hd 512, L 640 = 128 window slots + 512 top-k entries), the keys
// pointing into two device buffers (a window ring and a compressed-entry pool) with nullptr
// entries (OFFICIAL's window pad, dropped entries, a row whose first two 64-blocks are empty), and
// at the lists the GPU engine builds on the QAT-free fixture (three key buffers, R 40 and 13).
// Tolerances (scores, denominators and P.V chains are the host's, see attention.cu; what differs:
// exp, fp64 here and glibc expf there, 6e-4 of exps an fp32 ulp apart; at L > 64 the fp64 fold of
// per-block partials against the host's single chain; and the fp64 tensor cores' 4-product steps
// against the host's sequential fmas, which round differently only where a partial sum is not
// exact in fp64: these random fp32 keys, never the official numerics' quantized ones):
//  - TRANSFORMERS: |gpu - host| <= 1e-5 * max |host| over the row's hd outputs (1e-6 at the
//    engine's lists; the measured figure is printed). A row with no key: exactly 0.
//  - OFFICIAL: bf16 outputs: a value within those differences of a bf16 rounding boundary can
//    land on the neighbour: every element equal or one bf16 ulp apart (or within 1e-5 * the row's
//    max |host|, for values near zero), and at most 1% of them different (at most 2 of 407040 at
//    the engine's lists; counts printed).
//  - A row computed alone or in a batch (R = 4, and R = 32, which switches both tile shapes):
//    bit-identical.
//  - Keys as packed cache records (FP8 window rows, FP4 entries): the bits of the same keys as
//    fp32 rows.
// Outputs are poisoned with NaN before each run. The timing line is information only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "engine/attention_row.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

// One list entry: buffer 0 (window ring), 1 (compressed entries) or 2 (the chunk's own kv rows)
// and a row, or buf < 0: nullptr.
struct key_ref {
    int buf = -1;
    int row = 0;
};

struct attn_case {
    int R = 0, H = 0, L = 0, hd = 0;
    std::vector<float> q, sink, bufs[3];
    std::vector<key_ref> lists;  // [R, L]
    float scale() const { return 1.0f / std::sqrt(float(hd)); }
};

// q ~ N(0, 1) times a per-head factor (0.25 .. 4: flat to peaked softmaxes), keys ~ N(0, 1),
// sinks ~ N(0, 2) with one head's sink far above every score (the sink takes the mass).
void fill_data(attn_case &c, int rows0, int rows1, uint32_t seed) {
    c.q = testing_util::random_normal(size_t(c.R) * c.H * c.hd, seed);
    for (int r = 0; r < c.R; r++)
        for (int h = 0; h < c.H; h++) {
            const float f = std::ldexp(1.0f, h % 5 - 2);
            for (int d = 0; d < c.hd; d++) c.q[(size_t(r) * c.H + h) * c.hd + d] *= f;
        }
    c.sink = testing_util::random_normal(size_t(c.H), seed + 1);
    for (auto &s : c.sink) s *= 2.0f;
    c.sink[size_t(c.H - 1)] = 40.0f;
    c.bufs[0] = testing_util::random_normal(size_t(rows0) * c.hd, seed + 2);
    c.bufs[1] = testing_util::random_normal(size_t(rows1) * c.hd, seed + 3);
}

// The engine's list shape: nw window keys in chronological order (ring slots from `start`), pads
// up to `width`, then the selected entries (each dropped to nullptr with probability `drop`).
void push_list(attn_case &c, int nw, int start, int ring, int width, const std::vector<int> &entries, double drop,
               std::mt19937 &rng) {
    for (int j = 0; j < nw; j++) c.lists.push_back({0, (start + j) % ring});
    for (int j = nw; j < width; j++) c.lists.push_back({});
    std::uniform_real_distribution<double> u(0, 1);
    for (int e : entries) c.lists.push_back(u(rng) < drop ? key_ref{} : key_ref{1, e});
}

std::vector<int> pick_entries(int n, int pool, std::mt19937 &rng) {
    std::vector<int> all(pool);
    for (int i = 0; i < pool; i++) all[size_t(i)] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(size_t(n));
    return all;
}

// Fixture shape: R 3, window 8 + 4 entries: a full window, a partly filled one (pads), a full
// one with a dropped entry.
attn_case fixture_case(int hd) {
    attn_case c;
    c.R = 3, c.H = 4, c.L = 12, c.hd = hd;
    fill_data(c, 8, 16, 11);
    std::mt19937 rng(12);
    push_list(c, 8, 5, 8, 8, pick_entries(4, 16, rng), 0.0, rng);
    push_list(c, 3, 0, 8, 8, pick_entries(4, 16, rng), 0.0, rng);
    c.lists.push_back({0, 2});  // row 2: built by hand, one dropped entry in the middle
    for (int j = 1; j < 8; j++) c.lists.push_back({0, (2 + j) % 8});
    c.lists.push_back({1, 7}), c.lists.push_back({}), c.lists.push_back({1, 0}), c.lists.push_back({1, 15});
    return c;
}

// V4.1 decode shape: window ring of 128 rows, 2048 compressed entries, 512 selected per row.
// Rows cycle through: full window; empty window (two leading all-null 64-blocks); 37 keys; 5
// keys; each with ~4% of the selected entries dropped.
attn_case real_case(int R, uint32_t seed) {
    attn_case c;
    c.R = R, c.H = 64, c.L = 640, c.hd = 512;
    fill_data(c, 128, 2048, seed);
    std::mt19937 rng(seed + 7);
    const int windows[] = {128, 0, 37, 5};
    for (int r = 0; r < R; r++) push_list(c, windows[r % 4], int(rng() % 128), 128, 128, pick_entries(512, 2048, rng), 0.04, rng);
    return c;
}

// The lists engine/cuda/v41_gpu.cpp attention() builds on the V4.1 fixture (window 8, index
// top-k 4, H 4, hd 40) for a chunk of S rows at positions p0 ..: per row the window keys in
// chronological order (ring rows older than the chunk, then the chunk's own kv rows), OFFICIAL's
// nullptr pads up to the window width, the row's selected compressed entries (min(4, entries
// completed so far, one per 2 positions): early rows have fewer), trailing nullptrs up to the
// longest list. Three key buffers as in the engine: ring (0), entry pool (1), chunk kv rows (2).
attn_case engine_case(int p0, int S, bool official, uint32_t seed) {
    constexpr int W = 8, TOPK = 4;
    attn_case c;
    c.R = S, c.H = 4, c.hd = 40;
    const int n_entries = std::max(1, (p0 + S) / 2);
    fill_data(c, W, n_entries, seed);
    c.bufs[2] = testing_util::random_normal(size_t(S) * c.hd, seed + 4);
    std::mt19937 rng(seed + 5);
    std::vector<std::vector<key_ref>> lists(S);
    size_t L = 0;
    for (int s = 0; s < S; s++) {
        auto &l = lists[size_t(s)];
        const int p = p0 + s;
        for (int kp = std::max(0, p0 - W); kp < p0; kp++)
            if (kp > p - W) l.push_back({0, kp % W});
        for (int t = 0; t <= s; t++)
            if (p0 + t > p - W) l.push_back({2, t});
        if (official)
            while (int(l.size()) < W) l.push_back({});
        const int visible = (p + 1) / 2;
        for (int e : pick_entries(std::min(TOPK, visible), visible, rng)) l.push_back({1, e});
        L = std::max(L, l.size());
    }
    c.L = int(L);
    for (auto &l : lists) {
        l.resize(L);  // trailing nullptrs
        c.lists.insert(c.lists.end(), l.begin(), l.end());
    }
    return c;
}

std::vector<float> host_reference(const attn_case &c, bool official) {
    std::vector<float> out(size_t(c.R) * c.H * c.hd);
    engine::attn_scratch scratch;
    std::vector<const float *> keys;
    for (int r = 0; r < c.R; r++) {
        keys.clear();
        for (int i = 0; i < c.L; i++) {
            const key_ref k = c.lists[size_t(r) * c.L + i];
            keys.push_back(k.buf < 0 ? nullptr : c.bufs[k.buf].data() + size_t(k.row) * c.hd);
        }
        for (int h = 0; h < c.H; h++) {
            const size_t o = (size_t(r) * c.H + h) * c.hd;
            engine::attend_row(c.q.data() + o, keys, c.sink[size_t(h)], c.scale(), c.hd, official, scratch, out.data() + o);
        }
    }
    return out;
}

// The case's arrays on the device, the lists as device pointers.
struct device_case {
    dev_vec<float> q, sink, buf0, buf1, buf2, out;
    dev_vec<const float *> keys;
    explicit device_case(const attn_case &c)
        : q(c.q), sink(c.sink), buf0(c.bufs[0]), buf1(c.bufs[1]), buf2(c.bufs[2]), out(c.q.size()),
          keys(std::max<size_t>(1, c.lists.size())) {
        std::vector<const float *> ptrs(keys.n, nullptr);
        const float *base[3] = {buf0.p, buf1.p, buf2.p};
        for (size_t i = 0; i < c.lists.size(); i++) {
            const key_ref k = c.lists[i];
            if (k.buf >= 0) ptrs[i] = base[k.buf] + size_t(k.row) * c.hd;
        }
        keys.upload(ptrs);
    }
};

cuda::attention_batch batch_of(const attn_case &c, device_case &d, bool official) {
    cuda::attention_batch b;
    b.q = d.q.p, b.keys = d.keys.p, b.sink = d.sink.p, b.scale = c.scale();
    b.R = c.R, b.H = c.H, b.L = c.L, b.hd = c.hd, b.official = official, b.out = d.out.p;
    return b;
}

std::vector<float> run_gpu(const attn_case &c, device_case &d, bool official) {
    d.out.poison();
    const Status st = cuda::run_attention(batch_of(c, d, official), nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return d.out.download();
}

// Checks got against the host per the tolerances above; prints the figures.
void compare(const attn_case &c, const std::vector<float> &got, const std::vector<float> &ref, bool official,
             const std::string &what) {
    ASSERT_EQ(got.size(), ref.size());
    double worst = 0, worst_any = 0;
    size_t differ = 0, bad = 0;
    for (int rh = 0; rh < c.R * c.H; rh++) {
        const float *g = got.data() + size_t(rh) * c.hd, *h = ref.data() + size_t(rh) * c.hd;
        float rowmax = 0;
        for (int d = 0; d < c.hd; d++) rowmax = std::max(rowmax, std::fabs(h[d]));
        for (int d = 0; d < c.hd; d++) {
            ASSERT_TRUE(std::isfinite(g[d])) << what << ": (row, head) " << rh << " dim " << d << " not written";
            const double err = std::fabs(double(g[d]) - double(h[d]));
            if (err == 0) continue;
            differ++;
            const double rel = rowmax > 0 ? err / rowmax : INFINITY;
            worst = std::max(worst, rel);
            bool ok;
            if (!official) {
                ok = rel <= 1e-5;
            } else {
                // one bf16 ulp: adjacent bf16 values differ by 2^-7 of the larger's power of two
                const float big = std::max(std::fabs(g[d]), std::fabs(h[d]));
                const double ulp = std::ldexp(1.0, std::ilogb(big) - 7);
                ok = err <= ulp * 1.0000001 || rel <= 1e-5;
                worst_any = std::max(worst_any, err / ulp);
            }
            if (!ok && bad++ < 5)
                ADD_FAILURE() << what << ": (row, head) " << rh << " dim " << d << " gpu " << g[d] << " host " << h[d]
                              << " (row max " << rowmax << ")";
        }
    }
    EXPECT_EQ(bad, 0u) << what;
    if (official) {
        EXPECT_LE(differ, got.size() / 100) << what;
    }
    std::printf("[ info ] %s: %zu of %zu outputs differ from attend_row, max |d| / row max %.3g%s\n", what.c_str(),
                differ, got.size(), worst, official ? (", max " + std::to_string(worst_any) + " bf16 ulp").c_str() : "");
}

class CudaAttention : public testing_util::CudaOps {};

TEST_F(CudaAttention, FixtureShapesMatchAttendRow) {
    for (int hd : {64, 40}) {
        const attn_case c = fixture_case(hd);
        device_case d(c);
        for (bool official : {false, true}) {
            const std::string what = std::string(official ? "official" : "transformers") + " fixture H 4 hd " +
                                     std::to_string(hd) + " L 12";
            compare(c, run_gpu(c, d, official), host_reference(c, official), official, what);
        }
    }
}

// The sweep's figures: outputs that differ, those beyond the bound (or not written), the worst
// |d| / row max and (OFFICIAL) the worst distance in bf16 ulps.
struct sweep_figures {
    size_t differ = 0, total = 0, beyond = 0;
    double worst = 0, worst_ulp = 0;
};

void add_to_sweep(const attn_case &c, const std::vector<float> &got, const std::vector<float> &ref, bool official,
                  const std::string &what, sweep_figures &f) {
    f.total += got.size();
    for (int rh = 0; rh < c.R * c.H; rh++) {
        const float *g = got.data() + size_t(rh) * c.hd, *h = ref.data() + size_t(rh) * c.hd;
        float rowmax = 0;
        for (int k = 0; k < c.hd; k++) rowmax = std::max(rowmax, std::fabs(h[k]));
        for (int k = 0; k < c.hd; k++) {
            const double err = std::fabs(double(g[k]) - double(h[k]));
            if (err == 0) continue;
            f.differ++;
            bool bad = !std::isfinite(g[k]);  // NaN poison: not written
            if (!bad) f.worst = std::max(f.worst, err / rowmax);
            if (official) {
                const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(g[k]), std::fabs(h[k]))) - 7);
                f.worst_ulp = std::max(f.worst_ulp, err / ulp);
                bad = bad || err > ulp * 1.0000001;
            } else {
                bad = bad || err > 1e-6 * rowmax;
            }
            if (bad && f.beyond++ < 3)
                ADD_FAILURE() << what << ": (row, head) " << rh << " dim " << k << " gpu " << g[k] << " host " << h[k]
                              << " (row max " << rowmax << ")";
        }
    }
}

// The GPU engine's calls on the QAT-free V4.1 fixture (hd 40: keys left unquantized), where the
// first version of this kernel (fp32 P.V, butterfly denominators) flipped an OFFICIAL output by a
// bf16 ulp a few times per 10^5 and the engine's logits moved by 2.4e-2 (issue 4). Swept over
// 48 seeds of a 40-row prefill (R 40) and a 13-row chunk after 8 positions (R 13): 407040
// outputs per numerics. With one 64-entry block P.V and the denominators are the host's chains,
// so only exp (fp64 here, glibc expf there: 6e-4 of exps differ by an fp32 ulp) separates them:
//  - OFFICIAL: at most 2 outputs in the sweep differ from attend_row, each by one bf16 ulp (the
//    fp32 kernel, run on a CPU emulation of its launches: 20 differ, two of them values near
//    zero that fp32 cancellation put 117 and 6 bf16 ulps off: this test fails on it);
//  - TRANSFORMERS: |gpu - host| <= 1e-6 * the row's max |host| (the fp32 kernel: 4.1e-7, within
//    it: TRANSFORMERS was never the problem).
TEST_F(CudaAttention, V41FixtureEngineListsMatchAttendRow) {
    const std::pair<int, int> chunks[] = {{0, 40}, {8, 13}};  // (p0, S)
    for (bool official : {true, false}) {
        const std::string what = std::string(official ? "official" : "transformers") + " engine lists H 4 hd 40 R 40 + R 13";
        sweep_figures f;
        for (uint32_t seed = 1; seed <= 48; seed++)
            for (const auto &[p0, S] : chunks) {
                const attn_case c = engine_case(p0, S, official, 1000 * seed + uint32_t(S));
                device_case d(c);
                add_to_sweep(c, run_gpu(c, d, official), host_reference(c, official), official,
                             what + " seed " + std::to_string(seed) + " R " + std::to_string(S), f);
            }
        EXPECT_EQ(f.beyond, 0u) << what;
        if (official) {
            EXPECT_LE(f.differ, 2u) << what;
        }
        std::printf("[ info ] %s, 48 seeds: %zu of %zu outputs differ from attend_row, max |d| / row max %.3g%s\n",
                    what.c_str(), f.differ, f.total, f.worst,
                    official ? (", max " + std::to_string(f.worst_ulp) + " bf16 ulp").c_str() : "");
    }
}

// R 4 takes the small tiles (8 x 32 scores, per-block P.V partials and the fold kernel), R 32
// the large ones (64 x 64 scores, P.V folded in registers) on an H200.
TEST_F(CudaAttention, V41ShapeMatchesAttendRow) {
    for (int R : {4, 32}) {
        const attn_case c = real_case(R, 21);
        device_case d(c);
        for (bool official : {false, true}) {
            const std::string what =
                std::string(official ? "official" : "transformers") + " V4.1 R " + std::to_string(R) + " H 64 hd 512 L 640";
            const std::vector<float> got = run_gpu(c, d, official);
            compare(c, got, host_reference(c, official), official, what);
        }
    }
}

// Empty lists and all-null lists give zeros (the host's P.V over no key), in both numerics.
TEST_F(CudaAttention, NoKeysGiveZeros) {
    for (int L : {0, 70}) {
        attn_case c;
        c.R = 2, c.H = 4, c.L = L, c.hd = 64;
        fill_data(c, 4, 4, 31);
        c.lists.assign(size_t(c.R) * L, key_ref{});
        device_case d(c);
        for (bool official : {false, true}) {
            const std::vector<float> got = run_gpu(c, d, official), ref = host_reference(c, official);
            for (float v : ref) ASSERT_EQ(v, 0.0f) << "the host reference is expected to give zeros";
            EXPECT_EQ(testing_util::bit_mismatches(got, ref, "no keys L " + std::to_string(L)), 0u);
        }
    }
}

// Each row run alone (R = 1) must give the bits it gets inside a batch: R = 4 (same launch shapes
// as R = 1 on an H200) and R = 32 (large score tiles and the in-register fold).
TEST_F(CudaAttention, RowAloneEqualsRowInBatch) {
    for (int R : {4, 32}) {
        const attn_case c = real_case(R, 41 + uint32_t(R));
        device_case d(c);
        for (bool official : {false, true}) {
            const std::vector<float> batch = run_gpu(c, d, official);
            const size_t row = size_t(c.H) * c.hd;
            dev_vec<float> one(row);
            for (int r : {0, 1, R / 2 + 1, R - 1}) {
                cuda::attention_batch b = batch_of(c, d, official);
                b.R = 1, b.q = d.q.p + r * row, b.keys = d.keys.p + size_t(r) * c.L, b.out = one.p;
                one.poison();
                const Status st = cuda::run_attention(b, nullptr);
                ASSERT_TRUE(st.is_ok()) << st.to_string();
                const std::vector<float> alone = one.download();
                const std::vector<float> in_batch(batch.begin() + r * row, batch.begin() + (r + 1) * row);
                EXPECT_EQ(testing_util::bit_mismatches(alone, in_batch,
                                                       std::string(official ? "official" : "transformers") + " row " +
                                                           std::to_string(r) + " of R " + std::to_string(R)),
                          0u);
            }
        }
    }
}

// The caches' packed records as keys (cache_pack.cuh key_record): the window ring as FP8 + E8M0
// per 32 records, the entries as FP4 + E4M3 per 16, against the same rows unpacked to fp32 (what
// attention read before the pools): bit-identical outputs in both numerics, at V4.1's shape (R 1:
// the whole-hd score tile, which decodes while staging; R 32: the chunked tiles and the folded
// P.V) and at hd 64 (records padded to 16 bytes: 80 and 48); lists of records only, and lists
// mixing fp32 rows (the window) with records (the entries). At hd 512 also V4's records (FP8 +
// E8M0 per 64 with a bf16 rope tail) for every key.
TEST_F(CudaAttention, PackedKeysGiveTheBitsOfTheirRows) {
    using cuda::key_format;
    // Attention over `keys` (records standing in for case c's rows) against run_gpu over d's
    // fp32 rows, both numerics: the same bits.
    auto same_bits = [&](const attn_case &c, device_case &d, const dev_vec<const float *> &keys, const std::string &label) {
        for (bool official : {false, true}) {
            const std::string what = std::string(official ? "official" : "transformers") + " R " + std::to_string(c.R) +
                                     " hd " + std::to_string(c.hd) + label;
            const std::vector<float> want = run_gpu(c, d, official);
            cuda::attention_batch b = batch_of(c, d, official);
            b.keys = keys.p;
            d.out.poison();
            const Status st = cuda::run_attention(b, nullptr);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            EXPECT_EQ(testing_util::bit_mismatches(d.out.download(), want, what), 0u);
        }
    };
    for (const attn_case &c0 : {real_case(1, 71), real_case(32, 72), fixture_case(64)}) {
        const int hd = c0.hd, rows0 = int(c0.bufs[0].size()) / hd, rows1 = int(c0.bufs[1].size()) / hd;
        const int64_t p8 = cuda::key_record_bytes(key_format::FP8_UE8M0_32, hd);
        const int64_t p4 = cuda::key_record_bytes(key_format::FP4_E4M3_16, hd);
        dev_vec<float> raw0(c0.bufs[0]), raw1(c0.bufs[1]), un0(c0.bufs[0].size()), un1(c0.bufs[1].size());
        dev_vec<uint8_t> rec0(size_t(rows0 * p8)), rec1(size_t(rows1 * p4));
        ASSERT_TRUE(cuda::pack_fp8_ue8m0(raw0.p, rows0, hd, hd, 32, cuda::fp8_records(rec0.p, hd), nullptr).is_ok());
        ASSERT_TRUE(cuda::pack_fp4_e4m3(raw1.p, rows1, hd, 16, cuda::fp4_records(rec1.p, hd), nullptr).is_ok());
        ASSERT_TRUE(cuda::unpack_fp8_ue8m0(cuda::fp8_records(rec0.p, hd), rows0, hd, hd, 32, un0.p, nullptr).is_ok());
        ASSERT_TRUE(cuda::unpack_fp4_e4m3(cuda::fp4_records(rec1.p, hd), rows1, hd, 16, un1.p, nullptr).is_ok());
        attn_case c = c0;
        c.bufs[0] = un0.download(), c.bufs[1] = un1.download();
        device_case d(c);  // fp32 rows
        for (bool window_packed : {true, false}) {
            std::vector<const float *> ptrs(d.keys.n, nullptr);
            for (size_t i = 0; i < c.lists.size(); i++) {
                const key_ref k = c.lists[i];
                if (k.buf == 0)
                    ptrs[i] = window_packed ? cuda::key_record(rec0.p + k.row * p8, key_format::FP8_UE8M0_32)
                                            : d.buf0.p + size_t(k.row) * hd;
                else if (k.buf == 1)
                    ptrs[i] = cuda::key_record(rec1.p + k.row * p4, key_format::FP4_E4M3_16);
                else
                    ASSERT_LT(k.buf, 0) << "these cases use two key buffers";
            }
            dev_vec<const float *> keys(ptrs);
            same_bits(c, d, keys, window_packed ? " all packed" : " entries packed");
        }
        // V4's records: FP8 + E8M0 per 64 on hd - 64 channels and a bf16 rope tail, every key.
        if (hd <= int(cuda::KEY_BF16_TAIL) || (hd - cuda::KEY_BF16_TAIL) % 64 != 0) continue;
        const key_format f4 = key_format::FP8_UE8M0_64_BF16_TAIL;
        const int64_t pt = cuda::key_record_bytes(f4, hd), cols = hd - cuda::KEY_BF16_TAIL;
        dev_vec<uint8_t> t0(size_t(rows0 * pt)), t1(size_t(rows1 * pt));
        ASSERT_TRUE(cuda::pack_fp8_ue8m0(raw0.p, rows0, hd, cols, 64, cuda::fp8_tail_records(t0.p, hd), nullptr).is_ok());
        ASSERT_TRUE(cuda::pack_fp8_ue8m0(raw1.p, rows1, hd, cols, 64, cuda::fp8_tail_records(t1.p, hd), nullptr).is_ok());
        ASSERT_TRUE(cuda::unpack_fp8_ue8m0(cuda::fp8_tail_records(t0.p, hd), rows0, hd, cols, 64, un0.p, nullptr).is_ok());
        ASSERT_TRUE(cuda::unpack_fp8_ue8m0(cuda::fp8_tail_records(t1.p, hd), rows1, hd, cols, 64, un1.p, nullptr).is_ok());
        attn_case cv4 = c0;
        cv4.bufs[0] = un0.download(), cv4.bufs[1] = un1.download();
        device_case dv4(cv4);
        std::vector<const float *> ptrs(dv4.keys.n, nullptr);
        for (size_t i = 0; i < cv4.lists.size(); i++) {
            const key_ref k = cv4.lists[i];
            if (k.buf >= 0) ptrs[i] = cuda::key_record((k.buf == 0 ? t0.p : t1.p) + k.row * pt, f4);
        }
        dev_vec<const float *> keys(ptrs);
        same_bits(cv4, dv4, keys, " V4 records");
    }
}

TEST_F(CudaAttention, RejectsBadShapes) {
    cuda::attention_batch b;
    b.R = 1, b.H = 1, b.L = 0, b.hd = 6;
    EXPECT_EQ(cuda::run_attention(b, nullptr).code(), status_code::INVALID_ARGUMENT);
    b.hd = 8;
    EXPECT_EQ(cuda::run_attention(b, nullptr).code(), status_code::INVALID_ARGUMENT);  // no q / out / sink
    dev_vec<float> buf(64);
    b.q = buf.p, b.out = buf.p + 4, b.sink = buf.p;
    EXPECT_EQ(cuda::run_attention(b, nullptr).code(), status_code::INVALID_ARGUMENT);  // out overlaps q
}

// Information only: the V4.1 shape at decode batches (R 1, 4, 16) and a prefill chunk (R 2048)
// with a caller's workspace; the FLOP rate counts the scores and P.V (4 R H L hd).
TEST_F(CudaAttention, TimingAtV41Shape) {
    for (int R : {1, 4, 16, 2048}) {
        const attn_case c = real_case(R, 61);
        device_case d(c);
        for (bool official : {false, true}) {
            cuda::attention_batch b = batch_of(c, d, official);
            dev_vec<uint8_t> ws(cuda::attention_workspace_bytes(b));
            b.workspace = ws.p;
            // Every list entry counted as a distinct key row read (the test's rows repeat, so L2 helps).
            const double bytes = double(R) * c.L * c.hd * 4 + 2.0 * R * c.H * c.hd * 4;
            const double flop = 4.0 * R * c.H * c.L * c.hd;
            const double us = testing_util::time_us([&] { (void)cuda::run_attention(b, nullptr); }, R > 16 ? 5 : 100);
            std::printf("[ time ] attention %s R %d H 64 hd 512 L 640: %.2f us per call, %.1f fp64 TFLOP/s, %.0f GB/s\n",
                        official ? "official" : "transformers", R, us, flop / us * 1e-6, bytes / us * 1e-3);
            ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        }
    }
}

}  // namespace
