// Packed cache rows (backend/cuda/cache_pack) at the pools' real row shapes: V4.1 window KV
// (FP8, 512 per 32: 528 B), compressed entries (FP4 + E4M3 per 16: 288 B), index keys (FP4 +
// E8M0 per 32: 68 B); V4 window KV (FP8 448 per 64 + bf16 rope tail) and rotated index keys.
// Checks, all bit-exact (mismatches 0):
//  - unpack(pack(x)) equals the CPU fake quant of x (backend/cpu), tail channels round_bf16(x);
//  - the packed bytes equal the codes core/dtype's host conversions give for the CPU's values
//    and scales (f32_to_e8m0 / f32_to_e4m3 of the scale, f32_to_e4m3 / f32_to_e2m1 of value / scale).
// Every output array (codes, scales, tail, unpacked rows) is poisoned with 0xff first.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cpu/ops.h"
#include "backend/cuda/cache_pack.cuh"
#include "backend/cuda/fake_quant.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

enum class kind { FP8, FP4_UE8M0, FP4_E4M3 };

// The CPU's scale of one block, as backend/cpu ops.cpp forms it.
float cpu_scale(kind k, const float *p, int64_t block) {
    float amax = 0;
    for (int64_t i = 0; i < block; i++) amax = std::max(amax, std::fabs(p[i]));
    if (k == kind::FP8) return cpu::pow2_ceil(std::max(amax, 1e-4f) * (1.0f / 448.0f));
    if (k == kind::FP4_UE8M0) return cpu::pow2_ceil(std::max(amax, 6.0f * std::ldexp(1.0f, -126)) * (1.0f / 6.0f));
    return round_e4m3(std::max(amax, 6.0f * std::ldexp(1.0f, -9)) / 6.0f, true);
}

class CudaCachePack : public testing_util::CudaOps {
protected:
    // rows of width stride; the first cols channels quantized in blocks; rotate: V4 index keys.
    void check(const std::string &what, kind k, int64_t rows, int64_t stride, int64_t cols, int64_t block,
               int64_t expect_row_bytes, bool rotate = false) {
        const bool fp8 = k == kind::FP8;
        const int64_t code_bytes = fp8 ? cols : cols / 2, nsc = cols / block, tail_w = stride - cols;
        EXPECT_EQ(code_bytes + nsc + 2 * tail_w, expect_row_bytes) << what << ": bytes per row";

        std::vector<float> x = testing_util::quant_rows(rows, stride, uint32_t(rows * 17 + stride + int(k)));
        if (rotate)
            for (auto &v : x) v = round_bf16(v);
        // CPU side: the fake quant (and, for V4's keys, the rotation first).
        std::vector<float> src = x;
        if (rotate) {
            cpu::hadamard_transform(src.data(), rows, stride, 1.0f / std::sqrt(float(stride)));
            for (auto &v : src) v = round_bf16(v);
        }
        std::vector<float> ref = src;
        if (k == kind::FP8) cpu::fake_quant_fp8_ue8m0_cols(ref.data(), rows, stride, cols, block);
        if (k == kind::FP4_UE8M0) cpu::fake_quant_fp4_ue8m0(ref.data(), rows, stride, block);
        if (k == kind::FP4_E4M3) cpu::fake_quant_fp4_e4m3(ref.data(), rows, stride, block);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = cols; c < stride; c++) ref[size_t(r * stride + c)] = round_bf16(src[size_t(r * stride + c)]);
        // The expected bytes from core/dtype's host conversions.
        std::vector<uint8_t> want_codes(size_t(rows * code_bytes), 0), want_scales(size_t(rows * nsc));
        std::vector<uint16_t> want_tail(size_t(rows * tail_w));
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t b = 0; b < nsc; b++) {
                const float s = cpu_scale(k, src.data() + r * stride + b * block, block);
                want_scales[size_t(r * nsc + b)] = k == kind::FP4_E4M3 ? f32_to_e4m3(s) : f32_to_e8m0(s);
                for (int64_t i = 0; i < block; i++) {
                    const int64_t c = b * block + i;
                    const float q = ref[size_t(r * stride + c)] / s;
                    if (fp8) want_codes[size_t(r * code_bytes + c)] = f32_to_e4m3(q);
                    else want_codes[size_t(r * code_bytes + c / 2)] |= uint8_t(f32_to_e2m1(q) << (4 * (c & 1)));
                }
            }
            for (int64_t c = 0; c < tail_w; c++) want_tail[size_t(r * tail_w + c)] = f32_to_bf16(src[size_t(r * stride + cols + c)]);
        }

        dev_vec<float> dx(x), dback(x.size());
        dev_vec<uint8_t> dcodes(want_codes.size()), dscales(want_scales.size());
        dev_vec<uint16_t> dtail(want_tail.size());
        dcodes.poison();
        dscales.poison();
        dtail.poison();
        dback.poison();
        Status st;
        if (rotate) {
            ASSERT_TRUE(cuda::hadamard_rotate_bf16(dx.p, rows, stride, nullptr).is_ok());
        }
        if (fp8) {
            cuda::fp8_rows pk{dcodes.p, dscales.p, tail_w ? dtail.p : nullptr};
            st = cuda::pack_fp8_ue8m0(dx.p, rows, stride, cols, block, pk, nullptr);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            st = cuda::unpack_fp8_ue8m0(pk, rows, stride, cols, block, dback.p, nullptr);
        } else {
            cuda::fp4_rows pk{dcodes.p, dscales.p};
            st = k == kind::FP4_UE8M0 ? cuda::pack_fp4_ue8m0(dx.p, rows, stride, block, pk, nullptr)
                                      : cuda::pack_fp4_e4m3(dx.p, rows, stride, block, pk, nullptr);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            st = k == kind::FP4_UE8M0 ? cuda::unpack_fp4_ue8m0(pk, rows, stride, block, dback.p, nullptr)
                                      : cuda::unpack_fp4_e4m3(pk, rows, stride, block, dback.p, nullptr);
        }
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::vector<float> back = dback.download();
        const std::vector<uint8_t> codes = dcodes.download(), scales = dscales.download();
        const std::vector<uint16_t> tail = dtail.download();

        const size_t bad_rows = testing_util::bit_mismatches(back, ref, what + " unpack(pack(x)) vs cpu fake quant");
        auto count = [&](const auto &got, const auto &want, const char *name) {
            size_t bad = 0;
            for (size_t i = 0; i < want.size(); i++)
                if (got[i] != want[i] && bad++ < 5)
                    ADD_FAILURE() << what << ": " << name << " byte " << i << " " << int(got[i]) << " vs " << int(want[i]);
            return bad;
        };
        const size_t bad_codes = count(codes, want_codes, "code");
        const size_t bad_scales = count(scales, want_scales, "scale");
        const size_t bad_tail = count(tail, want_tail, "tail");
        EXPECT_EQ(bad_rows + bad_codes + bad_scales + bad_tail, 0u) << what;
        std::printf("[ info ] %s [%lld rows, %lld B/row]: mismatches rows %zu, codes %zu, scales %zu, tail %zu\n",
                    what.c_str(), (long long)rows, (long long)expect_row_bytes, bad_rows, bad_codes, bad_scales, bad_tail);
    }
};

TEST_F(CudaCachePack, V41WindowKvFp8) { check("V4.1 window KV fp8/32", kind::FP8, 128, 512, 512, 32, 528); }

TEST_F(CudaCachePack, V41CompressedEntryFp4E4m3) {
    check("V4.1 compressed entry fp4/e4m3/16", kind::FP4_E4M3, 96, 512, 512, 16, 288);
}

TEST_F(CudaCachePack, V41IndexKeyFp4Ue8m0) { check("V4.1 index key fp4/ue8m0/32", kind::FP4_UE8M0, 96, 128, 128, 32, 68); }

TEST_F(CudaCachePack, V4WindowKvFp8WithBf16RopeTail) {
    check("V4 window KV fp8/64 + bf16 rope", kind::FP8, 128, 512, 448, 64, 448 + 7 + 128);
}

TEST_F(CudaCachePack, V4RotatedIndexKeyFp4) {
    check("V4 rotated index key fp4/ue8m0/32", kind::FP4_UE8M0, 96, 128, 128, 32, 68, true);
}

// Records (a row's codes then its scales in one 16-byte-padded record, as attention reads
// packed keys): each record's bytes equal the dense arrays' row (checked against the CPU above),
// and unpacking the records gives the dense unpack's bits, as does pack_fp8_records (rows to
// records anywhere, the window ring's store); a pitch that cannot hold a row is refused.
TEST_F(CudaCachePack, RecordsHoldTheDenseRowsBytes) {
    for (const bool fp8 : {true, false}) {
        const int64_t rows = 96, hd = 512, block = fp8 ? 32 : 16, code_bytes = fp8 ? hd : hd / 2, nsc = hd / block;
        const int64_t pitch = cuda::key_record_bytes(fp8 ? cuda::key_format::FP8_UE8M0_32 : cuda::key_format::FP4_E4M3_16, hd);
        EXPECT_EQ(pitch, fp8 ? 528 : 288);
        const std::string what = fp8 ? "V4.1 window KV records" : "V4.1 compressed entry records";
        const std::vector<float> x = testing_util::quant_rows(rows, hd, fp8 ? 5u : 6u);
        dev_vec<float> dx(x), dense_back(x.size()), rec_back(x.size());
        dev_vec<uint8_t> codes(size_t(rows * code_bytes)), scales(size_t(rows * nsc)), rec(size_t(rows * pitch));
        rec.poison();
        dense_back.poison(), rec_back.poison();
        Status st;
        if (fp8) {
            ASSERT_TRUE(cuda::pack_fp8_ue8m0(dx.p, rows, hd, hd, block, {codes.p, scales.p}, nullptr).is_ok());
            ASSERT_TRUE(cuda::unpack_fp8_ue8m0({codes.p, scales.p}, rows, hd, hd, block, dense_back.p, nullptr).is_ok());
            st = cuda::pack_fp8_ue8m0(dx.p, rows, hd, hd, block, cuda::fp8_records(rec.p, hd), nullptr);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            st = cuda::unpack_fp8_ue8m0(cuda::fp8_records(rec.p, hd), rows, hd, hd, block, rec_back.p, nullptr);
        } else {
            ASSERT_TRUE(cuda::pack_fp4_e4m3(dx.p, rows, hd, block, {codes.p, scales.p}, nullptr).is_ok());
            ASSERT_TRUE(cuda::unpack_fp4_e4m3({codes.p, scales.p}, rows, hd, block, dense_back.p, nullptr).is_ok());
            st = cuda::pack_fp4_e4m3(dx.p, rows, hd, block, cuda::fp4_records(rec.p, hd), nullptr);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            st = cuda::unpack_fp4_e4m3(cuda::fp4_records(rec.p, hd), rows, hd, block, rec_back.p, nullptr);
        }
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::vector<uint8_t> c = codes.download(), sc = scales.download(), r = rec.download();
        size_t bad = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < code_bytes + nsc; j++) {
                const uint8_t want = j < code_bytes ? c[size_t(i * code_bytes + j)] : sc[size_t(i * nsc + j - code_bytes)];
                if (r[size_t(i * pitch + j)] != want && bad++ < 5)
                    ADD_FAILURE() << what << ": row " << i << " byte " << j << " " << int(r[size_t(i * pitch + j)]) << " vs "
                                  << int(want);
            }
        EXPECT_EQ(bad, 0u) << what;
        EXPECT_EQ(testing_util::bit_mismatches(rec_back.download(), dense_back.download(), what + " unpacked"), 0u);
        if (fp8) {  // pack_fp8_records, row i into record rows - 1 - i (two launches): the same records
            dev_vec<uint8_t> rec2(size_t(rows * pitch));
            rec2.poison();
            std::vector<cuda::row_pack> jobs;
            for (int64_t i = 0; i < rows; i++) jobs.push_back({dx.p + i * hd, rec2.p + (rows - 1 - i) * pitch});
            st = cuda::pack_fp8_records(jobs.data(), int(jobs.size()), hd, cuda::key_format::FP8_UE8M0_32, nullptr);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            const std::vector<uint8_t> r2 = rec2.download();
            size_t bad2 = 0;
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < code_bytes + nsc; j++)
                    if (r2[size_t((rows - 1 - i) * pitch + j)] != r[size_t(i * pitch + j)] && bad2++ < 5)
                        ADD_FAILURE() << "pack_fp8_records: row " << i << " byte " << j;
            EXPECT_EQ(bad2, 0u);
            EXPECT_FALSE(cuda::pack_fp8_records(jobs.data(), 1, 40, cuda::key_format::FP8_UE8M0_32, nullptr).is_ok());  // hd not whole blocks
        }
        // A pitch short of a row (aligned), and one that holds it but misaligns the codes.
        if (fp8) {
            EXPECT_FALSE(cuda::pack_fp8_ue8m0(dx.p, rows, hd, hd, block, {rec.p, rec.p + hd, nullptr, hd + nsc - 4}, nullptr).is_ok());
        } else {
            EXPECT_FALSE(cuda::pack_fp4_e4m3(dx.p, rows, hd, block, {rec.p, rec.p + hd / 2, 289}, nullptr).is_ok());
        }
    }
}

// V4's records (FP8 + E8M0 per 64 on the first hd - 64 channels, then the rope tail as bf16 at
// key_tail_offset): the record's codes, scales and tail bytes equal the dense arrays' (checked
// against the CPU by V4WindowKvFp8WithBf16RopeTail), unpacking the records gives the dense
// unpack's bits, and pack_fp8_records writes the same records; at V4's hd 512 and the fixture's 128.
TEST_F(CudaCachePack, V4RecordsHoldTheDenseRowsAndTailBytes) {
    const auto fmt = cuda::key_format::FP8_UE8M0_64_BF16_TAIL;
    for (const int64_t hd : {int64_t(512), int64_t(128)}) {
        const int64_t rows = 70, cols = hd - cuda::KEY_BF16_TAIL, nsc = cols / 64, tw = hd - cols;
        const int64_t pitch = cuda::key_record_bytes(fmt, hd), toff = cuda::key_tail_offset(hd);
        if (hd == 512) EXPECT_EQ(pitch, 592);
        ASSERT_GE(toff, cols + nsc);
        ASSERT_EQ(toff % 8, 0);
        const std::string what = "V4 records, hd " + std::to_string(hd);
        std::vector<float> x = testing_util::random_normal(size_t(rows * hd), uint32_t(40 + hd));
        cpu::fake_quant_fp8_ue8m0_cols(x.data(), rows, hd, cols, 64);  // rows as the engine stores them
        dev_vec<float> dx(x), dense_back(x.size()), rec_back(x.size());
        dev_vec<uint8_t> codes(size_t(rows * cols)), scales(size_t(rows * nsc)), rec(size_t(rows * pitch));
        dev_vec<uint16_t> tail(size_t(rows * tw));
        rec.poison(), dense_back.poison(), rec_back.poison();
        ASSERT_TRUE(cuda::pack_fp8_ue8m0(dx.p, rows, hd, cols, 64, {codes.p, scales.p, tail.p}, nullptr).is_ok());
        ASSERT_TRUE(cuda::unpack_fp8_ue8m0({codes.p, scales.p, tail.p}, rows, hd, cols, 64, dense_back.p, nullptr).is_ok());
        Status st = cuda::pack_fp8_ue8m0(dx.p, rows, hd, cols, 64, cuda::fp8_tail_records(rec.p, hd), nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        st = cuda::unpack_fp8_ue8m0(cuda::fp8_tail_records(rec.p, hd), rows, hd, cols, 64, rec_back.p, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::vector<uint8_t> c = codes.download(), sc = scales.download(), r = rec.download();
        const std::vector<uint16_t> t = tail.download();
        // The record's meaningful bytes: codes, scales, the tail (2 bytes a channel, low byte first).
        auto want_byte = [&](int64_t i, int64_t j, bool *meaningful) -> uint8_t {
            *meaningful = true;
            if (j < cols) return c[size_t(i * cols + j)];
            if (j < cols + nsc) return sc[size_t(i * nsc + j - cols)];
            if (j >= toff && j < toff + 2 * tw) {
                const uint16_t v = t[size_t(i * tw + (j - toff) / 2)];
                return uint8_t((j - toff) % 2 ? v >> 8 : v & 0xff);
            }
            *meaningful = false;
            return 0;
        };
        size_t bad = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < pitch; j++) {
                bool m = false;
                const uint8_t want = want_byte(i, j, &m);
                if (m && r[size_t(i * pitch + j)] != want && bad++ < 5)
                    ADD_FAILURE() << what << ": row " << i << " byte " << j;
            }
        EXPECT_EQ(bad, 0u) << what;
        EXPECT_EQ(testing_util::bit_mismatches(rec_back.download(), dense_back.download(), what + " unpacked"), 0u);
        // pack_fp8_records, row i into record rows - 1 - i: the same records.
        dev_vec<uint8_t> rec2(size_t(rows * pitch));
        rec2.poison();
        std::vector<cuda::row_pack> jobs;
        for (int64_t i = 0; i < rows; i++) jobs.push_back({dx.p + i * hd, rec2.p + (rows - 1 - i) * pitch});
        st = cuda::pack_fp8_records(jobs.data(), int(jobs.size()), hd, fmt, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::vector<uint8_t> r2 = rec2.download();
        size_t bad2 = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < pitch; j++) {
                bool m = false;
                (void)want_byte(i, j, &m);
                if (m && r2[size_t((rows - 1 - i) * pitch + j)] != r[size_t(i * pitch + j)] && bad2++ < 5)
                    ADD_FAILURE() << what << ", pack_fp8_records: row " << i << " byte " << j;
            }
        EXPECT_EQ(bad2, 0u) << what;
    }
    // hd not 64 plus whole blocks of 64; a tail that does not fit its record.
    dev_vec<float> x(size_t(512));
    dev_vec<uint8_t> rec(size_t(1024));
    std::vector<cuda::row_pack> one = {{x.p, rec.p}};
    EXPECT_FALSE(cuda::pack_fp8_records(one.data(), 1, 96, fmt, nullptr).is_ok());
    EXPECT_FALSE(cuda::pack_fp8_records(one.data(), 1, 512, cuda::key_format::FP4_E4M3_16, nullptr).is_ok());
    cuda::fp8_rows short_rec = cuda::fp8_tail_records(rec.p, 512);
    short_rec.pitch = cuda::key_tail_offset(512) + 64;  // holds half the tail
    EXPECT_FALSE(cuda::pack_fp8_ue8m0(x.p, 1, 512, 448, 64, short_rec, nullptr).is_ok());
}

TEST_F(CudaCachePack, RejectsMissingTailAndMisalignedCodes) {
    dev_vec<float> x(size_t(512));
    dev_vec<uint8_t> codes(size_t(1024)), scales(size_t(64));
    EXPECT_FALSE(cuda::pack_fp8_ue8m0(x.p, 1, 512, 448, 64, cuda::fp8_rows{codes.p, scales.p, nullptr}, nullptr).is_ok());
    EXPECT_FALSE(cuda::pack_fp8_ue8m0(x.p, 1, 512, 512, 32, cuda::fp8_rows{codes.p + 1, scales.p, nullptr}, nullptr).is_ok());
}

}  // namespace
