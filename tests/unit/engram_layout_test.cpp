// The Engram prime layout against the released V4.1 Flash values (spec 4.9 item 6, recomputed
// there independently): layers 1 and 14 draw the first 24 and the next 24 primes >= 16,000,000
// (16000057 ... 16000463, 16000477 ... 16000889), and their sums are the table row counts.
#include <gtest/gtest.h>

#include "model/engram_layout.h"

using namespace ds41rt::model;

TEST(engram_layout, released_primes_and_table_sizes) {
    const auto primes = engram_primes(16000000, 2, 4, 8);
    ASSERT_EQ(primes.size(), 48u);
    EXPECT_EQ(primes[0], 16000057);
    EXPECT_EQ(primes[23], 16000463);
    EXPECT_EQ(primes[24], 16000477);
    EXPECT_EQ(primes[47], 16000889);
    const auto sums = engram_prime_sums(16000000, 2, 4, 8);
    ASSERT_EQ(sums.size(), 2u);
    EXPECT_EQ(sums[0], 384006168);
    EXPECT_EQ(sums[1], 384016682);
}

TEST(engram_layout, primes_are_never_reused_and_runs_restart) {
    // Two heads, three n-gram sizes above 50: 53 59 | 61 67 | 71 73 (the restart at 50 for each
    // n finds the used primes taken and moves past them).
    const auto p = engram_primes(50, 1, 4, 2);
    const std::vector<int64_t> want = {53, 59, 61, 67, 71, 73};
    EXPECT_EQ(p, want);
}
