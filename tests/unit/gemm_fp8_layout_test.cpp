// Host emulation of the fragment traffic of backend/cuda/gemm_fp8.cu: ldmatrix.x4 and
// mma.m16n8k32 (8-bit operands) written from the PTX ISA's fragment tables, driven by the
// kernel's own lane mapping (gemm_fp8_layout.h), must reproduce the plain product of a block
// tile and place every output at its tile coordinate exactly once. Integer codes stand in for
// E4M3 (the mapping does not care about the number format), so the check is exact.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/gemm_fp8_layout.h"

namespace L = ds41rt::backend::cuda::gemm_fp8_layout;

namespace {

// ldmatrix.sync.aligned.m8n8.x4.b16: lanes 8i .. 8i + 7 give the row addresses of matrix i;
// lane t receives in register i the 32 bits at columns 2 (t % 4), 2 (t % 4) + 1 (b16) of row
// t / 4 of matrix i, i.e. bytes 4 (t % 4) .. +3 of the row lane 8i + t / 4 addressed.
void ldsm_x4(const uint8_t *smem, const int (&offset)[32], uint32_t (&r)[32][4]) {
    for (int t = 0; t < 32; t++)
        for (int i = 0; i < 4; i++) std::memcpy(&r[t][i], smem + offset[8 * i + t / 4] + 4 * (t % 4), 4);
}

int8_t byte_of(uint32_t reg, int j) { return int8_t((reg >> (8 * j)) & 0xffu); }

// mma.m16n8k32.row.col with 8-bit A / B (PTX ISA fragment tables, groupID g = lane / 4,
// threadID_in_group q = lane % 4). A element i (register i / 4, byte i % 4): row g for
// i in 0..3 and 8..11, else g + 8; column 4q + i % 4, plus 16 for i >= 8. B element i (register
// i / 4, byte i % 4): row 4q + i % 4, plus 16 for i >= 4; column g. C element i: row g (i < 2)
// or g + 8, column 2q + i % 2.
void mma_m16n8k32(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], int64_t (&c)[32][4]) {
    int64_t A[16][32] = {}, B[32][8] = {};
    for (int t = 0; t < 32; t++) {
        const int g = t / 4, q = t % 4;
        for (int i = 0; i < 16; i++) {
            const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8;
            const int col = 4 * q + (i % 4) + (i >= 8 ? 16 : 0);
            A[row][col] = byte_of(a[t][i / 4], i % 4);
        }
        for (int i = 0; i < 8; i++) B[4 * q + (i % 4) + (i >= 4 ? 16 : 0)][g] = byte_of(b[t][i / 4], i % 4);
    }
    for (int t = 0; t < 32; t++) {
        const int g = t / 4, q = t % 4;
        for (int i = 0; i < 4; i++) {
            const int row = i < 2 ? g : g + 8, col = 2 * q + i % 2;
            int64_t s = 0;
            for (int k = 0; k < 32; k++) s += A[row][k] * B[k][col];
            c[t][i] += s;
        }
    }
}

TEST(GemmFp8Layout, emulated_fragments_reproduce_the_block_tile_product) {
    std::mt19937 rng(7);
    std::vector<uint8_t> sa(size_t(L::BM) * L::PITCH), sb(size_t(L::BN) * L::PITCH);
    for (auto &v : sa) v = uint8_t(rng());
    for (auto &v : sb) v = uint8_t(rng());
    std::vector<int64_t> got(size_t(L::BM) * L::BN, 0);
    std::vector<int> hits(size_t(L::BM) * L::BN, 0);
    for (int wm = 0; wm < L::WARPS_M; wm++)
        for (int wn = 0; wn < L::WARPS_N; wn++) {
            int64_t acc[L::MT][L::NT][32][4] = {};
            for (int kb = 0; kb < L::KB; kb++) {
                uint32_t a[L::MT][32][4];
                for (int mt = 0; mt < L::MT; mt++) {
                    int off[32];
                    for (int l = 0; l < 32; l++) off[l] = L::a_ldsm_offset(wm, mt, kb, l);
                    ldsm_x4(sa.data(), off, a[mt]);
                }
                for (int p = 0; p < L::NT / 2; p++) {
                    int off[32];
                    for (int l = 0; l < 32; l++) off[l] = L::b_ldsm_offset(wn, p, kb, l);
                    uint32_t r[32][4];
                    ldsm_x4(sb.data(), off, r);
                    for (int j = 0; j < 2; j++) {
                        uint32_t b[32][2];
                        for (int l = 0; l < 32; l++) b[l][0] = r[l][2 * j], b[l][1] = r[l][2 * j + 1];  // as the kernel splits them
                        for (int mt = 0; mt < L::MT; mt++) mma_m16n8k32(a[mt], b, acc[mt][2 * p + j]);
                    }
                }
            }
            for (int mt = 0; mt < L::MT; mt++)
                for (int nt = 0; nt < L::NT; nt++)
                    for (int l = 0; l < 32; l++)
                        for (int e = 0; e < 4; e++) {
                            const size_t i = size_t(L::c_row(wm, mt, l, e)) * L::BN + L::c_col(wn, nt, l, e);
                            got[i] = acc[mt][nt][l][e];
                            hits[i]++;
                        }
        }
    size_t wrong = 0, twice = 0;
    for (int m = 0; m < L::BM; m++)
        for (int n = 0; n < L::BN; n++) {
            int64_t want = 0;
            for (int k = 0; k < L::BK; k++) want += int64_t(int8_t(sa[size_t(m) * L::PITCH + k])) * int8_t(sb[size_t(n) * L::PITCH + k]);
            const size_t i = size_t(m) * L::BN + n;
            if (hits[i] != 1) twice++;
            else if (got[i] != want && wrong++ < 5) ADD_FAILURE() << "tile element (" << m << ", " << n << "): " << got[i] << " vs " << want;
        }
    EXPECT_EQ(twice, 0u) << "tile elements not owned by exactly one lane";
    EXPECT_EQ(wrong, 0u);
}

// The operand rows a warp reads never reach the padding bytes of a row, and the 8 rows of each
// ldmatrix phase fall on distinct bank quads (no shared-memory bank conflicts).
TEST(GemmFp8Layout, ldmatrix_rows_stay_in_the_tile_and_avoid_bank_conflicts) {
    for (int wm = 0; wm < L::WARPS_M; wm++)
        for (int mt = 0; mt < L::MT; mt++)
            for (int kb = 0; kb < L::KB; kb++)
                for (int phase = 0; phase < 4; phase++) {
                    unsigned quads = 0;
                    for (int l = 8 * phase; l < 8 * phase + 8; l++) {
                        const int off = L::a_ldsm_offset(wm, mt, kb, l);
                        EXPECT_LT(off % L::PITCH + 16, L::BK + 1);
                        EXPECT_EQ(off % 16, 0);
                        quads |= 1u << ((off / 16) % 8);
                    }
                    EXPECT_EQ(quads, 0xffu);
                }
    for (int wn = 0; wn < L::WARPS_N; wn++)
        for (int p = 0; p < L::NT / 2; p++)
            for (int kb = 0; kb < L::KB; kb++)
                for (int phase = 0; phase < 4; phase++) {
                    unsigned quads = 0;
                    for (int l = 8 * phase; l < 8 * phase + 8; l++) {
                        const int off = L::b_ldsm_offset(wn, p, kb, l);
                        EXPECT_LT(off % L::PITCH + 16, L::BK + 1);
                        quads |= 1u << ((off / 16) % 8);
                    }
                    EXPECT_EQ(quads, 0xffu);
                }
}

}  // namespace
