// GPU row gathers (backend/cuda/embedding): the BF16 token embedding at V4.1's full shape
// [129280, 5120] into the four mHC streams, and FP8 + E8M0 Engram rows (256 channels; a 1M-row
// table standing in for the 384M rows, the indexing is the same). Exact conversions: bit-exact
// against core/dtype's bf16_to_f32 and e4m3_to_f32 * e8m0_to_f32 (model/weights' Engram
// dequantization). Outputs are poisoned with 0x7f bytes (a finite value no gathered element
// has), so unwritten elements and the NaN rows of out-of-range ids are both seen.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cuda/embedding.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finalizer: a cheap deterministic fill
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

class CudaEmbedding : public testing_util::CudaOps {};

TEST_F(CudaEmbedding, Bf16TokenRowsIntoStreams) {
    const int64_t vocab = 129280, dim = 5120;
    const int copies = 4;
    std::vector<uint16_t> table(size_t(vocab * dim));
    for (size_t i = 0; i < table.size(); i++) {
        const uint64_t h = mix(i);
        table[i] = uint16_t((h & 0x807fu) | ((0x70u + ((h >> 8) & 0xfu)) << 7));  // |v| in 2^-15 .. 2^0
    }
    const std::vector<int32_t> ids = {0, 1, 128799, int32_t(vocab - 1), 5, -1, int32_t(vocab), 77777};
    const int64_t n = int64_t(ids.size());
    dev_vec<uint16_t> dt(table);
    dev_vec<int32_t> did(ids);
    dev_vec<float> out(size_t(n * copies * dim));
    out.poison(0x7f);
    ASSERT_TRUE(cuda::embed_rows_bf16(dt.p, vocab, dim, did.p, n, copies, out.p, nullptr).is_ok());
    const std::vector<float> got = out.download();
    size_t bad = 0;
    for (int64_t s = 0; s < n; s++)
        for (int j = 0; j < copies; j++)
            for (int64_t c = 0; c < dim; c++) {
                const float g = got[size_t((s * copies + j) * dim + c)];
                const int32_t id = ids[size_t(s)];
                const bool ok = (id < 0 || id >= vocab) ? std::isnan(g)
                                                        : f32_bits(g) == f32_bits(bf16_to_f32(table[size_t(id * dim + c)]));
                if (!ok && bad++ < 5) ADD_FAILURE() << "token " << s << " stream " << j << " channel " << c << ": " << g;
            }
    EXPECT_EQ(bad, 0u);
    std::printf("[ info ] embed_rows_bf16 [%lld, %lld] x %d streams, %lld ids (2 out of range): mismatches %zu\n",
                (long long)vocab, (long long)dim, copies, (long long)n, bad);
}

TEST_F(CudaEmbedding, Fp8EngramRows) {
    const int64_t rows = 1 << 20, dim = 256;
    std::vector<uint8_t> table(size_t(rows * dim)), scale(size_t(rows * dim / 32));
    for (size_t i = 0; i < table.size(); i++) {
        uint8_t b = uint8_t(mix(i));
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
        table[i] = b;
    }
    for (size_t i = 0; i < scale.size(); i++) scale[i] = uint8_t(110 + mix(i + 7) % 30);
    // Row 0 (gathered below) holds the edge codes: 0 is 2^-127 (not zero), 1 is 2^-126, 254 is 2^127
    // (products overflow to inf on both sides), 255 is NaN.
    scale[0] = 0, scale[1] = 1, scale[2] = 254, scale[3] = 255;
    std::vector<int64_t> ids = {0, rows - 1, 12345, -3, rows, 999999};
    for (int i = 0; i < 42; i++) ids.push_back(int64_t(mix(uint64_t(i) + 100) % uint64_t(rows)));
    const int64_t n = int64_t(ids.size());
    dev_vec<uint8_t> dt(table), ds(scale);
    dev_vec<int64_t> did(ids);
    dev_vec<float> out(size_t(n * dim));
    out.poison(0x7f);
    ASSERT_TRUE(cuda::gather_rows_fp8_e8m0(dt.p, ds.p, rows, dim, did.p, n, out.p, nullptr).is_ok());
    const std::vector<float> got = out.download();
    size_t bad = 0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t c = 0; c < dim; c++) {
            const float g = got[size_t(s * dim + c)];
            const int64_t id = ids[size_t(s)];
            bool ok = std::isnan(g);  // out-of-range ids give NaN rows
            if (id >= 0 && id < rows) {
                const float want = e4m3_to_f32(table[size_t(id * dim + c)]) * e8m0_to_f32(scale[size_t(id * (dim / 32) + c / 32)]);
                ok = std::isnan(want) ? std::isnan(g) : f32_bits(g) == f32_bits(want);
            }
            if (!ok && bad++ < 5) ADD_FAILURE() << "row " << s << " channel " << c << ": " << g;
        }
    EXPECT_EQ(bad, 0u);
    std::printf("[ info ] gather_rows_fp8_e8m0 [%lld, %lld], %lld ids (2 out of range): mismatches %zu\n", (long long)rows,
                (long long)dim, (long long)n, bad);
}

TEST_F(CudaEmbedding, RejectsBadShapes) {
    EXPECT_FALSE(cuda::gather_rows_fp8_e8m0(nullptr, nullptr, 10, 100, nullptr, 1, nullptr, nullptr).is_ok());
    EXPECT_FALSE(cuda::embed_rows_bf16(nullptr, 10, 16, nullptr, 1, 0, nullptr, nullptr).is_ok());
}

}  // namespace
