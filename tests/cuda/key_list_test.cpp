// The device-written half of attention key lists (backend/cuda/key_list) against the host's own
// construction of the same lists (engine/cuda before this kernel: entries + pick * hd for each of
// the first cnt picks, nothing after). Pointers are integers, so the comparison is exact; the
// whole key array is poisoned with 0xff bytes first, and the columns before col0 must keep it.
#include <gtest/gtest.h>

#include <random>

#include "backend/cuda/key_list.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using testing_util::dev_vec;

namespace {

class CudaKeyList : public testing_util::CudaOps {};

TEST_F(CudaKeyList, PicksBecomeEntryPointersAndShortRowsEndInNulls) {
    const int64_t n = 5, L = 700, col0 = 128, hd = 512;
    const int k = 512;
    std::mt19937 rng(7);
    std::vector<int32_t> idx(size_t(n) * k), cnt = {512, 0, 17, 511, 300};
    for (auto &v : idx) v = int32_t(rng() % 4096);
    dev_vec<int32_t> idx_d(idx), cnt_d(cnt);
    dev_vec<uint64_t> keys(size_t(n * L));
    keys.poison();
    dev_vec<float> entries(size_t(4096 * hd));
    ASSERT_TRUE(backend::cuda::fill_pick_keys(reinterpret_cast<const float **>(keys.p), L, col0, idx_d.p, cnt_d.p, n, k,
                                              entries.p, hd, nullptr)
                    .is_ok());
    const std::vector<uint64_t> got = keys.download();
    size_t bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < L; c++) {
            uint64_t want = ~uint64_t(0);  // untouched
            if (c >= col0 && c < col0 + k) {
                const int64_t j = c - col0;
                want = j < cnt[size_t(r)]
                           ? uint64_t(reinterpret_cast<uintptr_t>(entries.p + int64_t(idx[size_t(r * k + j)]) * hd))
                           : 0;
            }
            if (got[size_t(r * L + c)] != want && bad++ < 5)
                ADD_FAILURE() << "row " << r << " column " << c << ": " << std::hex << got[size_t(r * L + c)] << " vs "
                              << want;
        }
    EXPECT_EQ(bad, 0u);
    std::printf("    [key list] %lld rows x %d picks: %zu mismatches\n", (long long)n, k, bad);
}

TEST_F(CudaKeyList, RefusesPicksPastTheListEnd) {
    EXPECT_FALSE(backend::cuda::fill_pick_keys(nullptr, 600, 128, nullptr, nullptr, 1, 512, nullptr, 512, nullptr).is_ok());
}

}  // namespace
