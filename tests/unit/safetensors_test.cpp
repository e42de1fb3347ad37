// Tests for io/safetensors: round trips of every dtype, the Python reference file, sharded
// checkpoints, and a corpus of malformed files (truncations, lying headers, random mutations) that
// must come back as a Status, never a crash or an out-of-file view.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <sstream>

namespace ds41rt::io {
namespace {

namespace fs = std::filesystem;

// ---- helpers ----------------------------------------------------------------------------------

const dtype ALL_DTYPES[] = {dtype::F64,     dtype::F32,     dtype::F16, dtype::BF16, dtype::F8_E4M3,
                            dtype::F8_E8M0, dtype::F4_E2M1, dtype::I8,  dtype::U8,   dtype::I16,
                            dtype::I32,     dtype::I64,     dtype::BOOL};

// Bits per element spelled out here rather than taken from dtype_bits, so a wrong table in either
// place shows up.
uint64_t expected_nbytes(dtype t, uint64_t numel) {
    switch (t) {
    case dtype::F64: case dtype::I64: return numel * 8;
    case dtype::F32: case dtype::I32: return numel * 4;
    case dtype::F16: case dtype::BF16: case dtype::I16: return numel * 2;
    case dtype::F4_E2M1: return (numel + 1) / 2;
    default: return numel;
    }
}

std::string read_bytes(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

void write_bytes(const std::string &path, const std::string &bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    ASSERT_TRUE(f.good()) << path;
}

std::string le64(uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; i++) s[i] = char(uint8_t(n >> (8 * i)));
    return s;
}

uint64_t read_le64(const std::string &b) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | uint8_t(b[i]);
    return n;
}

// A file from a hand-written header and data_len bytes of data (byte i = i).
std::string raw_file(const std::string &header, size_t data_len) {
    std::string data(data_len, '\0');
    for (size_t i = 0; i < data_len; i++) data[i] = char(i);
    return le64(header.size()) + header + data;
}

// A tensor whose bytes are a recognisable pattern (seeded so tensors differ).
Tensor pattern_tensor(dtype t, shape_t shape, int seed) {
    Tensor x(t, std::move(shape));
    auto *p = static_cast<uint8_t *>(x.raw_mut());
    for (size_t i = 0; i < x.nbytes(); i++) p[i] = uint8_t(i * 37 + seed * 11 + 1);
    return x;
}

bool same_bytes(const Tensor &a, const Tensor &b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

template <typename T>
::testing::AssertionResult fails_with(const Result<T> &r, status_code code,
                                      std::initializer_list<std::string> needles) {
    if (r.is_ok()) return ::testing::AssertionFailure() << "unexpectedly ok";
    const Status s = r.status();
    if (s.code() != code)
        return ::testing::AssertionFailure() << "wrong code: " << s.to_string();
    for (const auto &n : needles)
        if (s.message().find(n) == std::string::npos)
            return ::testing::AssertionFailure() << "message lacks '" << n << "': " << s.message();
    return ::testing::AssertionSuccess() << s.message();
}

bool path_is_mapped(const std::string &path) {
    return read_bytes("/proc/self/maps").find(path) != std::string::npos;
}

// Each test gets its own empty directory, removed afterwards.
class safetensors_tmp : public ::testing::Test {
protected:
    void SetUp() override {
        const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = (fs::path(::testing::TempDir()) /
                (std::string("ds41rt_st_") + info->test_suite_name() + "_" + info->name() + "_" +
                 std::to_string(::getpid())))
                   .string();
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string &name) const { return (fs::path(dir_) / name).string(); }

    std::string dir_;
};

class safetensors_file_test : public safetensors_tmp {};
class safetensors_write_test : public safetensors_tmp {};
class safetensors_corrupt_test : public safetensors_tmp {};
class safetensors_checkpoint_test : public safetensors_tmp {};
class safetensors_fuzz_test : public safetensors_tmp {};

// ---- round trips ------------------------------------------------------------------------------

TEST_F(safetensors_file_test, round_trip_every_dtype_and_shape) {
    const std::vector<shape_t> shapes = {{}, {0}, {2, 3, 4}, {3, 0, 2}};
    std::vector<std::pair<std::string, Tensor>> in;
    int seed = 0;
    for (dtype t : ALL_DTYPES)
        for (size_t s = 0; s < shapes.size(); s++)
            in.emplace_back(std::string(dtype_name(t)) + "_s" + std::to_string(s),
                            pattern_tensor(t, shapes[s], seed++));
    // F4 scalar is one element in half a byte: 1 byte on disk.
    ASSERT_TRUE(write_safetensors(path("all.safetensors"), in).is_ok());

    auto f = safetensors_file::open(path("all.safetensors"));
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    ASSERT_EQ((*f)->tensors().size(), in.size());
    EXPECT_TRUE((*f)->metadata().empty());
    const std::string bytes = read_bytes(path("all.safetensors"));
    const uint64_t data_start = 8 + read_le64(bytes);
    EXPECT_EQ(data_start % 8, 0u) << "header must be padded to 8 bytes";
    uint64_t expect_offset = data_start;  // data laid out in the order given
    for (const auto &[name, t] : in) {
        const tensor_info *ti = (*f)->find(name);
        ASSERT_NE(ti, nullptr) << name;
        EXPECT_EQ(ti->type, t.type()) << name;
        EXPECT_EQ(ti->shape, t.shape()) << name;
        EXPECT_EQ(ti->file, path("all.safetensors"));
        EXPECT_EQ(ti->nbytes, expected_nbytes(t.type(), uint64_t(t.numel()))) << name;
        EXPECT_EQ(ti->data_offset, expect_offset) << name;
        expect_offset += ti->nbytes;
        auto got = (*f)->get(name);
        ASSERT_TRUE(got.is_ok()) << name;
        EXPECT_EQ(got->type(), t.type());
        EXPECT_EQ(got->shape(), t.shape());
        EXPECT_TRUE(same_bytes(*got, t)) << name;
    }
    EXPECT_EQ(expect_offset, bytes.size());
}

// Decision: F4 with an odd element count is accepted, stored in ceil(n/2) bytes with the last
// high nibble as padding (the shape counts elements, as the header says).
TEST_F(safetensors_file_test, f4_odd_element_count_uses_ceil_bytes) {
    Tensor odd = pattern_tensor(dtype::F4_E2M1, {5}, 1);
    Tensor odd2 = pattern_tensor(dtype::F4_E2M1, {3, 3}, 2);
    ASSERT_TRUE(write_safetensors(path("f4.safetensors"), {{"odd", odd}, {"odd2", odd2}}).is_ok());
    auto f = safetensors_file::open(path("f4.safetensors"));
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ((*f)->find("odd")->nbytes, 3u);
    EXPECT_EQ((*f)->find("odd2")->nbytes, 5u);
    auto got = (*f)->get("odd");
    ASSERT_TRUE(got.is_ok());
    for (size_t i = 0; i < 5; i++)
        EXPECT_EQ(e2m1_unpack(got->data<uint8_t>(), i), e2m1_unpack(odd.data<uint8_t>(), i)) << i;

    // floor(5/2) = 2 bytes is not enough.
    write_bytes(path("short.safetensors"),
                raw_file(R"({"w":{"dtype":"F4","shape":[5],"data_offsets":[0,2]}})", 2));
    EXPECT_TRUE(fails_with(safetensors_file::open(path("short.safetensors")), status_code::CORRUPTION,
                           {"'w'", "expected 3", "hold 2 bytes", "[5]"}));
}

TEST_F(safetensors_file_test, metadata_round_trip) {
    const std::map<std::string, std::string> meta = {
        {"format", "pt"}, {"empty", ""}, {"unicode", "naïve ✓"}, {"quote", "a\"b\\c\n"}};
    ASSERT_TRUE(write_safetensors(path("m.safetensors"), {{"x", Tensor::f32({2}, {1.f, 2.f})}}, meta)
                    .is_ok());
    auto f = safetensors_file::open(path("m.safetensors"));
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ((*f)->metadata(), meta);
    EXPECT_EQ((*f)->tensors().size(), 1u);  // __metadata__ is not a tensor
}

TEST_F(safetensors_file_test, reads_python_reference_file) {
    const std::string p = std::string(DS41RT_FIXTURES_DIR) + "/safetensors/numpy_reference.safetensors";
    auto r = safetensors_file::open(p);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const auto &f = *r;
    EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "np"},
                                                                  {"producer", "ds41rt fixture"}}));
    ASSERT_EQ(f->tensors().size(), 7u);
    // The header is 480 bytes (0x1e0); c_i64 is first in the data buffer.
    EXPECT_EQ(f->find("c_i64")->data_offset, 488u);
    EXPECT_EQ(f->find("a_f32")->data_offset, 488u + 32);

    auto a = f->get("a_f32");
    ASSERT_TRUE(a.is_ok());
    EXPECT_EQ(a->type(), dtype::F32);
    EXPECT_EQ(a->shape(), (shape_t{2, 3}));
    float av[6];
    std::memcpy(av, a->raw(), sizeof av);
    const float a_expect[6] = {-1.f, -0.5f, 0.f, 0.5f, 1.f, 1.5f};
    for (int i = 0; i < 6; i++) EXPECT_EQ(av[i], a_expect[i]) << i;

    auto b = f->get("b_f16");
    ASSERT_TRUE(b.is_ok());
    EXPECT_EQ(b->type(), dtype::F16);
    uint16_t bv[4];
    std::memcpy(bv, b->raw(), sizeof bv);
    EXPECT_EQ(f16_to_f32(bv[0]), 1.f);
    EXPECT_EQ(f16_to_f32(bv[1]), -2.5f);
    EXPECT_EQ(f16_to_f32(bv[2]), 65504.f);
    EXPECT_EQ(bv[3], 0u);

    auto c = f->get("c_i64");
    ASSERT_TRUE(c.is_ok());
    int64_t cv[3];
    std::memcpy(cv, c->raw(), sizeof cv);
    EXPECT_EQ(cv[0], -1);
    EXPECT_EQ(cv[1], 0);
    EXPECT_EQ(cv[2], 9007199254740993LL);

    auto d = f->get("d_bool");
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(d->type(), dtype::BOOL);
    EXPECT_EQ(std::string(d->data<char>(), 3), std::string("\1\0\1", 3));

    auto e = f->get("e_u8");
    ASSERT_TRUE(e.is_ok());
    EXPECT_EQ(e->shape(), (shape_t{0, 4}));
    EXPECT_EQ(e->nbytes(), 0u);

    auto s = f->get("f_f64");
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(s->shape(), shape_t{});
    double sv;
    std::memcpy(&sv, s->raw(), 8);
    EXPECT_EQ(sv, 3.25);

    auto g = f->get("g_i16");
    ASSERT_TRUE(g.is_ok());
    EXPECT_EQ(g->shape(), (shape_t{1, 2}));
    int16_t gv[2];
    std::memcpy(gv, g->raw(), sizeof gv);
    EXPECT_EQ(gv[0], -32768);
    EXPECT_EQ(gv[1], 32767);
}

TEST_F(safetensors_file_test, borrowed_tensor_keeps_mapping_until_last_holder) {
    const std::string p = path("keep.safetensors");
    ASSERT_TRUE(write_safetensors(p, {{"x", Tensor::f32({3}, {4.f, 5.f, 6.f})}}).is_ok());
    Tensor x;
    {
        auto f = safetensors_file::open(p);
        ASSERT_TRUE(f.is_ok());
        EXPECT_TRUE(path_is_mapped(p));
        auto got = (*f)->get("x");
        ASSERT_TRUE(got.is_ok());
        x = *got;
    }
    // The file object is gone; the tensor still holds the mapping.
    EXPECT_TRUE(path_is_mapped(p));
    float v[3];
    std::memcpy(v, x.raw(), sizeof v);
    EXPECT_EQ(v[2], 6.f);
    x = Tensor();
    EXPECT_FALSE(path_is_mapped(p)) << "mapping outlived every holder";
}

TEST_F(safetensors_file_test, missing_tensor_and_file_are_not_found) {
    ASSERT_TRUE(write_safetensors(path("a.safetensors"), {{"x", Tensor::f32({1}, {1.f})}}).is_ok());
    auto f = safetensors_file::open(path("a.safetensors"));
    ASSERT_TRUE(f.is_ok());
    EXPECT_EQ((*f)->find("y"), nullptr);
    EXPECT_TRUE(fails_with((*f)->get("y"), status_code::NOT_FOUND, {"'y'", path("a.safetensors")}));
    EXPECT_TRUE(fails_with(safetensors_file::open(path("nope.safetensors")), status_code::NOT_FOUND,
                           {path("nope.safetensors")}));
    EXPECT_TRUE(fails_with(safetensors_file::open(dir_), status_code::IO_ERROR, {dir_}));
}

// ---- writer -----------------------------------------------------------------------------------

TEST_F(safetensors_write_test, replaces_atomically_and_leaves_no_temp) {
    const std::string p = path("w.safetensors");
    ASSERT_TRUE(write_safetensors(p, {{"old", Tensor::f32({1}, {1.f})}}).is_ok());
    ASSERT_TRUE(write_safetensors(p, {{"new", Tensor::f32({2}, {2.f, 3.f})}}).is_ok());
    EXPECT_FALSE(fs::exists(p + ".tmp"));
    auto f = safetensors_file::open(p);
    ASSERT_TRUE(f.is_ok());
    EXPECT_EQ((*f)->find("old"), nullptr);
    EXPECT_NE((*f)->find("new"), nullptr);
}

TEST_F(safetensors_write_test, io_error_names_path_and_errno) {
    const std::string p = path("no/such/dir/w.safetensors");
    Status s = write_safetensors(p, {{"x", Tensor::f32({1}, {1.f})}});
    EXPECT_EQ(s.code(), status_code::IO_ERROR) << s.to_string();
    EXPECT_NE(s.message().find("No such file or directory"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
}

TEST_F(safetensors_write_test, rejects_bad_tensor_lists) {
    const Tensor x = Tensor::f32({1}, {1.f});
    EXPECT_EQ(write_safetensors(path("a"), {{"x", x}, {"x", x}}).code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(write_safetensors(path("b"), {{"__metadata__", x}}).code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(write_safetensors(path("c"), {{"empty", Tensor()}}).code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(write_safetensors(path("d"), {{"bad\xff utf8", x}}).code(), status_code::INVALID_ARGUMENT);
    for (const char *n : {"a", "b", "c", "d"}) {
        EXPECT_FALSE(fs::exists(path(n))) << n;
        EXPECT_FALSE(fs::exists(path(n) + ".tmp")) << n;
    }
}

// ---- malformed files --------------------------------------------------------------------------

TEST_F(safetensors_corrupt_test, truncated_at_every_region) {
    const std::string full_path = path("full.safetensors");
    ASSERT_TRUE(write_safetensors(full_path, {{"first", pattern_tensor(dtype::F32, {4}, 1)},
                                              {"last", pattern_tensor(dtype::BF16, {3, 2}, 2)}})
                    .is_ok());
    const std::string full = read_bytes(full_path);
    const uint64_t n = read_le64(full);
    ASSERT_EQ(full.size(), 8 + n + 16 + 12);
    struct cut_case {
        size_t at;
        std::vector<std::string> needles;
    };
    const std::vector<cut_case> cuts = {
        {0, {"0 bytes", "shorter than the 8-byte header length"}},
        {3, {"3 bytes", "shorter than the 8-byte"}},
        {7, {"7 bytes", "shorter than the 8-byte"}},
        {8, {"header length", "truncated by " + std::to_string(n)}},
        {8 + n / 2, {"header length", "truncated by " + std::to_string(n - n / 2)}},
        {8 + n - 1, {"header length", "truncated by 1 bytes"}},
        {8 + n, {"'last'", "[16, 28]", "truncated by 28 bytes"}},  // the whole data buffer
        {8 + n + 5, {"'last'", "truncated by 23 bytes"}},
        {8 + n + 16, {"'last'", "[16, 28]", "truncated by 12 bytes"}},
        {full.size() - 1, {"'last'", "truncated by 1 bytes"}},
    };
    for (const auto &c : cuts) {
        const std::string p = path("cut_" + std::to_string(c.at) + ".safetensors");
        write_bytes(p, full.substr(0, c.at));
        auto r = safetensors_file::open(p);
        auto expect = fails_with(r, status_code::CORRUPTION, {p});
        for (const auto &needle : c.needles)
            if (expect) expect = fails_with(r, status_code::CORRUPTION, {needle});
        EXPECT_TRUE(expect) << "cut at " << c.at;
    }
}

TEST_F(safetensors_corrupt_test, unknown_dtype_is_named) {
    write_bytes(path("u.safetensors"),
                raw_file(R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,2]}})", 2));
    EXPECT_TRUE(fails_with(safetensors_file::open(path("u.safetensors")), status_code::CORRUPTION,
                           {path("u.safetensors"), "'w'", "unknown dtype \"F7\""}));
}

// Headers that lie about shapes and offsets, or are not the right JSON at all.
TEST_F(safetensors_corrupt_test, lying_or_malformed_headers) {
    struct lie {
        const char *what;
        std::string header;
        size_t data_len;
        std::vector<std::string> needles;
    };
    const std::vector<lie> lies = {
        {"size mismatch", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16,
         {"'w'", "hold 12 bytes", "expected 16", "[2, 2]"}},
        {"begin > end", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[4,2]}})", 8,
         {"'w'", "[4, 2]", "begin > end"}},
        {"overlap", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
         8, {"'a' [0, 4]", "'b' [2, 6]", "overlap"}},
        {"end past data", R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 10,
         {"'w'", "[4, 12]", "truncated by 2 bytes"}},
        {"missing dtype", R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1, {"'w'", "\"dtype\""}},
        {"missing shape", R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1, {"'w'", "\"shape\""}},
        {"missing offsets", R"({"w":{"dtype":"U8","shape":[1]}})", 1, {"'w'", "\"data_offsets\""}},
        {"dtype not string", R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,1]}})", 1,
         {"'w'", "\"dtype\" is 4"}},
        {"shape not array", R"({"w":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", 1,
         {"'w'", "\"shape\" is 1"}},
        {"float dim", R"({"w":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1,
         {"'w'", "shape[0]"}},
        {"string dim", R"({"w":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})", 1,
         {"'w'", "shape[0]"}},
        {"negative dim", R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]}})", 1,
         {"'w'", "shape[1] is negative (-1)"}},
        {"three offsets", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 2,
         {"'w'", "data_offsets"}},
        {"negative offset", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 2,
         {"'w'", "data_offsets"}},
        {"numel overflows u64",
         R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 1,
         {"'w'", "more than 2^63 elements"}},
        {"numel over int64",
         R"({"w":{"dtype":"U8","shape":[3037000500,3037000500],"data_offsets":[0,0]}})", 1,
         {"'w'", "more than 2^63 elements"}},
        {"bytes overflow",
         R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", 8,
         {"'w'", "2^64 bits"}},
        {"dim over int64", R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})",
         1, {"'w'", "shape[0]"}},
        {"entry not object", R"({"w":[1,2]})", 0, {"'w'", "not an object"}},
        {"metadata not object", R"({"__metadata__":[1]})", 0, {"__metadata__", "not an object"}},
        {"metadata value not string", R"({"__metadata__":{"k":1}})", 0, {"'k'", "not a string"}},
        {"header not JSON", R"({"w":{"dtype":)", 0, {"not valid JSON"}},
        {"header is array", R"([1,2,3])", 0, {"not a JSON object"}},
        {"trailing garbage", R"({} x)", 0, {"not valid JSON"}},
        {"duplicate name", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                           R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
         2, {"'w'", "more than once"}},
    };
    for (const auto &l : lies) {
        const std::string p = path("lie.safetensors");
        write_bytes(p, raw_file(l.header, l.data_len));
        auto r = safetensors_file::open(p);
        auto expect = fails_with(r, status_code::CORRUPTION, {p});
        for (const auto &needle : l.needles)
            if (expect) expect = fails_with(r, status_code::CORRUPTION, {needle});
        EXPECT_TRUE(expect) << l.what;
    }
}

TEST_F(safetensors_corrupt_test, header_length_absurd_or_past_end) {
    write_bytes(path("absurd"), le64(uint64_t(1) << 40) + "{}");
    EXPECT_TRUE(fails_with(safetensors_file::open(path("absurd")), status_code::CORRUPTION,
                           {path("absurd"), "1099511627776", "limit"}));
    write_bytes(path("past"), le64(100) + "{}");
    EXPECT_TRUE(fails_with(safetensors_file::open(path("past")), status_code::CORRUPTION,
                           {path("past"), "header length 100", "truncated by 98 bytes"}));
}

// Gaps, trailing bytes and empty tensors sharing an offset are harmless and accepted.
TEST_F(safetensors_corrupt_test, gaps_and_empty_tensors_are_accepted) {
    write_bytes(path("g"), raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},)"
                                    R"("e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                                    R"("b":{"dtype":"U8","shape":[2],"data_offsets":[5,7]}}  )",
                                    9));
    auto f = safetensors_file::open(path("g"));
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    auto b = (*f)->get("b");
    ASSERT_TRUE(b.is_ok());
    EXPECT_EQ(b->data<uint8_t>()[0], 5);
    EXPECT_EQ(b->data<uint8_t>()[1], 6);
    // tensors() is in file order.
    EXPECT_EQ((*f)->tensors().front().name, "a");
    EXPECT_EQ((*f)->tensors().back().name, "b");
}

// ---- checkpoints ------------------------------------------------------------------------------

TEST_F(safetensors_checkpoint_test, sharded_with_index) {
    const Tensor a = pattern_tensor(dtype::BF16, {2, 2}, 1), b = pattern_tensor(dtype::I32, {3}, 2),
                 c = pattern_tensor(dtype::F8_E4M3, {4}, 3), extra = pattern_tensor(dtype::U8, {1}, 4);
    ASSERT_TRUE(write_safetensors(path("model-00001-of-00002.safetensors"), {{"a", a}, {"b", b}}).is_ok());
    ASSERT_TRUE(
        write_safetensors(path("model-00002-of-00002.safetensors"), {{"c", c}, {"extra", extra}}).is_ok());
    // A stray file the index does not name must be ignored.
    ASSERT_TRUE(write_safetensors(path("stray.safetensors"), {{"a", a}}).is_ok());
    write_bytes(path("model.safetensors.index.json"),
                R"({"metadata":{"total_size":24},"weight_map":{)"
                R"("a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
                R"("c":"model-00002-of-00002.safetensors"}})");
    auto ck = checkpoint::open(dir_);
    ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
    EXPECT_EQ(ck->dir(), dir_);
    EXPECT_EQ(ck->size(), 4u);
    EXPECT_EQ(ck->names(), (std::vector<std::string>{"a", "b", "c", "extra"}));
    EXPECT_TRUE(ck->has("extra"));
    EXPECT_FALSE(ck->has("d"));
    EXPECT_EQ(ck->find("c")->file, path("model-00002-of-00002.safetensors"));
    EXPECT_EQ(ck->find("d"), nullptr);
    for (const auto &[name, t] : std::vector<std::pair<std::string, Tensor>>{
             {"a", a}, {"b", b}, {"c", c}, {"extra", extra}}) {
        auto got = ck->get(name);
        ASSERT_TRUE(got.is_ok()) << name;
        EXPECT_TRUE(same_bytes(*got, t)) << name;
        EXPECT_EQ(got->shape(), t.shape()) << name;
    }
    EXPECT_TRUE(fails_with(ck->get("d"), status_code::NOT_FOUND, {"'d'"}));
}

TEST_F(safetensors_checkpoint_test, missing_shard_names_shard_and_tensor) {
    ASSERT_TRUE(write_safetensors(path("s1.safetensors"), {{"a", Tensor::f32({1}, {1.f})}}).is_ok());
    write_bytes(path("model.safetensors.index.json"),
                R"({"weight_map":{"a":"s1.safetensors","z":"s2.safetensors"}})");
    EXPECT_TRUE(fails_with(checkpoint::open(dir_), status_code::NOT_FOUND,
                           {"'s2.safetensors'", "'z'", "missing"}));
}

TEST_F(safetensors_checkpoint_test, mapped_tensor_absent_from_shard) {
    ASSERT_TRUE(write_safetensors(path("s1.safetensors"), {{"a", Tensor::f32({1}, {1.f})}}).is_ok());
    write_bytes(path("model.safetensors.index.json"),
                R"({"weight_map":{"a":"s1.safetensors","ghost":"s1.safetensors"}})");
    EXPECT_TRUE(fails_with(checkpoint::open(dir_), status_code::CORRUPTION,
                           {"'ghost'", "'s1.safetensors'"}));
}

TEST_F(safetensors_checkpoint_test, bad_index_is_corruption) {
    ASSERT_TRUE(write_safetensors(path("s1.safetensors"), {{"a", Tensor::f32({1}, {1.f})}}).is_ok());
    const std::string idx = path("model.safetensors.index.json");
    for (const char *text : {"not json", R"({"metadata":{}})", R"({"weight_map":[]})",
                             R"({"weight_map":{"a":7}})", R"({"weight_map":{"a":"../s1.safetensors"}})",
                             R"({"weight_map":{"a":"/etc/passwd"}})", R"({"weight_map":{}})"}) {
        write_bytes(idx, text);
        EXPECT_TRUE(fails_with(checkpoint::open(dir_), status_code::CORRUPTION, {idx})) << text;
    }
}

TEST_F(safetensors_checkpoint_test, duplicate_across_files_names_both) {
    ASSERT_TRUE(write_safetensors(path("a.safetensors"), {{"w", Tensor::f32({1}, {1.f})}}).is_ok());
    ASSERT_TRUE(write_safetensors(path("b.safetensors"), {{"w", Tensor::f32({1}, {2.f})}}).is_ok());
    EXPECT_TRUE(fails_with(checkpoint::open(dir_), status_code::CORRUPTION,
                           {"'w'", path("a.safetensors"), path("b.safetensors")}));
}

TEST_F(safetensors_checkpoint_test, single_file_wins_over_glob) {
    ASSERT_TRUE(write_safetensors(path("model.safetensors"), {{"w", Tensor::f32({1}, {1.f})}}).is_ok());
    ASSERT_TRUE(write_safetensors(path("other.safetensors"), {{"w", Tensor::f32({1}, {2.f})}}).is_ok());
    auto ck = checkpoint::open(dir_);
    ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
    EXPECT_EQ(ck->find("w")->file, path("model.safetensors"));
}

TEST_F(safetensors_checkpoint_test, glob_reads_every_safetensors_file) {
    ASSERT_TRUE(write_safetensors(path("b.safetensors"), {{"y", Tensor::f32({1}, {2.f})}}).is_ok());
    ASSERT_TRUE(write_safetensors(path("a.safetensors"), {{"x", Tensor::f32({1}, {1.f})}}).is_ok());
    write_bytes(path("notes.txt"), "not a checkpoint");
    write_bytes(path("broken.safetensors.bak"), "xx");
    auto ck = checkpoint::open(dir_);
    ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
    EXPECT_EQ(ck->names(), (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(ck->find("y")->file, path("b.safetensors"));

    // A broken file in the glob is reported, not skipped.
    write_bytes(path("c.safetensors"), "xx");
    EXPECT_TRUE(fails_with(checkpoint::open(dir_), status_code::CORRUPTION, {path("c.safetensors")}));
}

TEST_F(safetensors_checkpoint_test, empty_or_missing_dir_is_not_found) {
    EXPECT_TRUE(fails_with(checkpoint::open(dir_), status_code::NOT_FOUND, {dir_}));
    EXPECT_TRUE(fails_with(checkpoint::open(path("nope")), status_code::NOT_FOUND, {path("nope")}));
}

// ---- fuzz -------------------------------------------------------------------------------------

// Deterministic random mutations of a valid file's length field and header. Every outcome must be
// a clean Status, or a file whose every tensor lies inside the data buffer with the size its
// dtype and shape imply (read in full, so a sanitizer build would see a bad view).
TEST_F(safetensors_fuzz_test, header_mutations_never_crash_or_escape_the_file) {
    const std::string base_path = path("base.safetensors");
    ASSERT_TRUE(write_safetensors(base_path,
                                  {{"w1", pattern_tensor(dtype::F32, {2, 3}, 1)},
                                   {"w2", pattern_tensor(dtype::BF16, {5}, 2)},
                                   {"w3", pattern_tensor(dtype::F4_E2M1, {7}, 3)},
                                   {"s", pattern_tensor(dtype::I64, {}, 4)},
                                   {"e", pattern_tensor(dtype::U8, {0, 3}, 5)}},
                                  {{"note", "v1.2"}, {"n", "123"}})
                    .is_ok());
    const std::string base = read_bytes(base_path);
    const size_t header_end = 8 + read_le64(base);

    std::mt19937_64 rng(0x5afe7e25);
    auto pick = [&](size_t n) { return size_t(rng() % n); };
    auto adjust_length = [](std::string &f, int64_t delta) {
        if (f.size() < 8) return;
        const std::string len = le64(read_le64(f) + uint64_t(delta));
        f.replace(0, 8, len);
    };
    const std::string json_chars = "{}[]\",:0123456789-+eE. ";
    const char *numbers[] = {"0", "1", "-1", "7", "8", "32", "4294967296", "9223372036854775807",
                             "9223372036854775808", "18446744073709551616", "1e3", "1.5", "-0"};

    const std::string p = path("mutant.safetensors");
    int ok_count = 0, fail_count = 0;
    for (int iter = 0; iter < 3000; iter++) {
        std::string f = base;
        const int n_mut = 1 + int(pick(3));
        for (int m = 0; m < n_mut && f.size() > 0; m++) {
            const size_t hdr_hi = std::min(f.size(), header_end);
            switch (pick(5)) {
            case 0: {  // overwrite one byte of the length or header
                const size_t at = pick(hdr_hi);
                f[at] = pick(2) ? json_chars[pick(json_chars.size())] : char(pick(256));
                break;
            }
            case 1:  // truncate anywhere
                f.resize(pick(f.size() + 1));
                break;
            case 2: {  // insert digits into the header, usually keeping the length consistent
                if (hdr_hi <= 8) break;
                const size_t at = 8 + pick(hdr_hi - 8);
                const std::string digits(1 + pick(3), char('0' + pick(10)));
                f.insert(at, digits);
                if (pick(4)) adjust_length(f, int64_t(digits.size()));
                break;
            }
            case 3: {  // replace a number in the header with an interesting one
                std::vector<std::pair<size_t, size_t>> runs;
                for (size_t i = 8; i < hdr_hi;) {
                    if (f[i] >= '0' && f[i] <= '9') {
                        size_t j = i;
                        while (j < hdr_hi && f[j] >= '0' && f[j] <= '9') j++;
                        runs.emplace_back(i, j - i);
                        i = j;
                    } else {
                        i++;
                    }
                }
                if (runs.empty()) break;
                const auto [at, len] = runs[pick(runs.size())];
                const std::string num =
                    pick(3) ? numbers[pick(std::size(numbers))] : std::to_string(pick(64));
                f.replace(at, len, num);
                adjust_length(f, int64_t(num.size()) - int64_t(len));
                break;
            }
            default: {  // delete a short span of the header, keeping the length consistent
                if (hdr_hi <= 9) break;
                const size_t at = 8 + pick(hdr_hi - 8);
                const size_t len = std::min<size_t>(1 + pick(6), f.size() - at);
                f.erase(at, len);
                adjust_length(f, -int64_t(len));
                break;
            }
            }
        }
        write_bytes(p, f);
        auto r = safetensors_file::open(p);
        if (!r.is_ok()) {
            fail_count++;
            ASSERT_NE(r.status().code(), status_code::OK);
            ASSERT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
            continue;
        }
        ok_count++;
        const uint64_t data_start = 8 + read_le64(f);
        for (const tensor_info &t : (*r)->tensors()) {
            ASSERT_GE(t.data_offset, data_start) << "iter " << iter << " " << t.name;
            ASSERT_LE(t.data_offset + t.nbytes, f.size()) << "iter " << iter << " " << t.name;
            ASSERT_EQ(t.nbytes, expected_nbytes(t.type, uint64_t(shape_numel(t.shape))))
                << "iter " << iter << " " << t.name;
            auto got = (*r)->get(t.name);
            ASSERT_TRUE(got.is_ok());
            unsigned sum = 0;
            for (size_t i = 0; i < got->nbytes(); i++) sum += got->data<uint8_t>()[i];
            (void)sum;
        }
    }
    // Both outcomes must occur, or the mutations are not exercising the validator.
    EXPECT_GT(ok_count, 50) << "fail_count " << fail_count;
    EXPECT_GT(fail_count, 1500) << "ok_count " << ok_count;
}

}  // namespace
}  // namespace ds41rt::io
