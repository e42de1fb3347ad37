// The device Engram hash (backend/cuda engram_hash) against the host's engine::engram_hasher (the
// CPU reference's hash, whose released multipliers and primes are checked in tests/unit): every id
// of every Engram layer identical, over steps that mix sequences of several chunk lengths (a
// chunk's n-grams reach back into the device history the earlier steps left), with and without
// the dummy tables' modulo. The ids are poisoned before each call, so an id left unwritten fails.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/device_info.h"
#include "backend/cuda/engram_hash.cuh"
#include "engine/engram_hash.h"
#include "model/config.h"
#include "model/engram_layout.h"

namespace ds41rt {
namespace {

namespace cu = backend::cuda;

// A device copy of v, freed at scope end.
template <class T>
struct dbuf {
    T *p = nullptr;
    explicit dbuf(const std::vector<T> &v) {
        EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
        if (!v.empty()) {
            EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
        }
    }
    ~dbuf() { cudaFree(p); }
    dbuf(const dbuf &) = delete;
    dbuf &operator=(const dbuf &) = delete;
};

model::model_config engram_config() {
    model::model_config c;
    c.vocab_size = 1000;
    c.engram_compressed_vocab_size = 500;
    c.engram_layer_ids = {1, 3};
    c.engram_max_ngram = 4;
    c.engram_n_heads = 8;
    c.engram_vocab_size = 2000;
    c.engram_pad_id = 2;
    const std::vector<int64_t> primes = model::engram_primes(c.engram_vocab_size, 2, c.engram_max_ngram, c.engram_n_heads);
    const size_t per_layer = primes.size() / 2;
    for (size_t l = 0; l < 2; l++) {
        int64_t sum = 0;
        for (size_t i = 0; i < per_layer; i++) sum += primes[l * per_layer + i];
        c.engram_num_embeddings.push_back(sum);
    }
    return c;
}

void same_ids(const std::vector<int64_t> &table_rows) {
    if (auto d = cu::query_device(0); !d) GTEST_SKIP() << d.status().to_string();
    const model::model_config c = engram_config();
    std::mt19937_64 rng(7);
    std::vector<int64_t> token_map(size_t(c.vocab_size)), mult;
    for (int64_t &v : token_map) v = int64_t(rng() % uint64_t(c.engram_compressed_vocab_size));
    for (int i = 0; i < 2 * c.engram_max_ngram; i++) mult.push_back(int64_t(rng() % (uint64_t(1) << 47)) | 1);
    auto h = engine::engram_hasher::make(c, token_map, mult);
    ASSERT_TRUE(h) << h.status().to_string();
    const engine::engram_hasher &H = h.value();

    const std::vector<int32_t> map32(token_map.begin(), token_map.end());
    dbuf<int32_t> d_map(map32);
    dbuf<int64_t> d_mult(H.multipliers()), d_primes(H.primes()), d_offsets(H.offsets()), d_rows(table_rows);
    cu::engram_hash_tables t;
    t.token_map = d_map.p, t.mult = d_mult.p, t.primes = d_primes.p, t.offsets = d_offsets.p, t.table_rows = d_rows.p;
    t.layers = H.n_layers(), t.max_ngram = H.max_ngram(), t.heads = H.n_heads(), t.pad = H.pad();

    constexpr int SEQS = 3;
    const int ncols = H.n_cols();
    std::vector<std::vector<int64_t>> history(SEQS);  // the host's compressed ids, every position
    dbuf<int32_t> hist(std::vector<int32_t>(size_t(SEQS) * cu::ENGRAM_MAX_NGRAM, -1));
    const std::vector<std::vector<int>> chunks = {{7, 1, 2}, {1, 5, 1}, {1, 1, 3}, {2, 1, 1}, {1, 6, 1}, {1, 1, 1}};
    int64_t checked = 0;
    for (const auto &step : chunks) {
        std::vector<int32_t> tokens;
        std::vector<cu::engram_hash_row> rows;
        std::vector<int64_t> want;  // [layers][S][ncols], filled after the rows are known
        for (int q = 0; q < SEQS; q++)
            for (int s = 0; s < step[size_t(q)]; s++) {
                tokens.push_back(int32_t(rng() % uint64_t(c.vocab_size)));
                rows.push_back({hist.p + q * cu::ENGRAM_MAX_NGRAM, s, step[size_t(q)]});
            }
        const int S = int(tokens.size());
        want.assign(size_t(H.n_layers()) * S * ncols, 0);
        for (int q = 0, r = 0; q < SEQS; q++) {
            const int64_t p0 = int64_t(history[size_t(q)].size());
            for (int s = 0; s < step[size_t(q)]; s++) history[size_t(q)].push_back(H.compressed(tokens[size_t(r + s)]));
            for (int s = 0; s < step[size_t(q)]; s++, r++)
                for (int k = 0; k < H.n_layers(); k++) {
                    std::vector<int64_t> ids(static_cast<size_t>(ncols));
                    H.hash(history[size_t(q)], p0 + s, k, ids.data());
                    for (int col = 0; col < ncols; col++) {
                        if (table_rows[size_t(k)] > 0) ids[size_t(col)] %= table_rows[size_t(k)];
                        want[(size_t(k) * S + r) * ncols + col] = ids[size_t(col)];
                    }
                }
        }
        dbuf<int32_t> d_tokens(tokens);
        dbuf<cu::engram_hash_row> d_hrows(rows);
        dbuf<int64_t> d_ids(std::vector<int64_t>(want.size(), int64_t(0x7f7f7f7f7f7f7f7f)));
        ASSERT_TRUE(cu::engram_hash(t, d_tokens.p, d_hrows.p, S, d_ids.p, nullptr).is_ok());
        std::vector<int64_t> got(want.size());
        ASSERT_EQ(cudaMemcpy(got.data(), d_ids.p, got.size() * sizeof(int64_t), cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t i = 0; i < want.size(); i++) ASSERT_EQ(got[i], want[i]) << "id " << i << " of a step of " << S << " rows";
        checked += int64_t(want.size());
    }
    EXPECT_GT(checked, 1000);
}

TEST(CudaEngramHash, IdsAreTheHostHashers) { same_ids({0, 0}); }

TEST(CudaEngramHash, DummyTablesTakeTheModulo) { same_ids({0, 97}); }

TEST(CudaEngramHash, RefusesBadShapes) {
    cu::engram_hash_tables t;
    t.layers = 1, t.max_ngram = cu::ENGRAM_MAX_NGRAM + 1, t.heads = 1;
    EXPECT_FALSE(cu::engram_hash(t, nullptr, nullptr, 1, nullptr, nullptr).is_ok());
    t.max_ngram = 4;
    EXPECT_FALSE(cu::engram_hash(t, nullptr, nullptr, 1, nullptr, nullptr).is_ok());  // null tables
}

}  // namespace
}  // namespace ds41rt
