// The expert wire format (dist/wire.h): a request and a response survive the round trip bit for
// bit, and every kind of bad frame is refused with its own reason: truncated header or payload,
// bad magic, another protocol version, unknown kind, dtype or flags, a flipped payload or
// header byte, oversize fields, route tables that do not add up, a stale placement version,
// the wrong layer, request id or executor.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>

#include "dist/wire.h"

namespace ds41rt::dist {
namespace {

using backend::cpu::route_table;

route_table two_rows() {
    route_table rt;
    rt.offsets = {0, 2, 3};
    rt.routes = {{1, 0.25f}, {6, 0.75f}, {3, 1.5f}};
    return rt;
}

frame_bytes sample_request(uint64_t version = 0x1122334455667788ull) {
    frame_header h;
    h.placement_version = version;
    h.request_id = 42;
    h.layer = 7;
    h.flags = FLAG_OFFICIAL;
    const std::vector<float> x = {1.0f, -2.5f, 3.0e-7f, 1e30f, -0.0f, 7.0f};
    return encode_request(h, two_rows(), x.data(), 3);
}

// Rewrites the header CRC after a test edits header bytes, so the edit itself is what decoding
// sees (a tampered frame whose checksums are right, as a buggy or foreign peer would send).
void reseal(frame_bytes &f) {
    uint32_t c = uint32_t(crc32(crc32(0L, Z_NULL, 0), f.data(), 60));
    for (int i = 0; i < 4; i++) f[60 + size_t(i)] = uint8_t(c >> (8 * i));
}

void put32(frame_bytes &f, size_t off, uint32_t v) {
    for (int i = 0; i < 4; i++) f[off + size_t(i)] = uint8_t(v >> (8 * i));
}

std::string reason(const Status &st) { return st.message(); }

TEST(Wire, RequestRoundTripIsExact) {
    frame_bytes f = sample_request();
    ASSERT_EQ(f.size(), HEADER_BYTES + 2 * ROW_DESC_BYTES + 3 * ROUTE_BYTES + 6 * 4);
    // The layout is little-endian at the documented offsets, whatever the host.
    EXPECT_EQ(f[0], 'D');
    EXPECT_EQ(f[1], 'S');
    EXPECT_EQ(f[2], '4');
    EXPECT_EQ(f[3], 'W');
    EXPECT_EQ(f[8], 0x88);  // placement version, low byte first
    EXPECT_EQ(f[16], 42);   // request id
    EXPECT_EQ(f[24], 7);    // layer
    auto r = decode_request(f);
    ASSERT_TRUE(r) << r.status().to_string();
    EXPECT_EQ(r->h.placement_version, 0x1122334455667788ull);
    EXPECT_EQ(r->h.request_id, 42u);
    EXPECT_EQ(r->h.layer, 7u);
    EXPECT_EQ(r->h.rows, 2u);
    EXPECT_EQ(r->h.dim, 3u);
    EXPECT_EQ(r->h.flags, FLAG_OFFICIAL);
    EXPECT_EQ(r->routes.offsets, (std::vector<uint32_t>{0, 2, 3}));
    ASSERT_EQ(r->routes.routes.size(), 3u);
    EXPECT_EQ(r->routes.routes[1].expert, 6u);
    EXPECT_EQ(r->routes.routes[1].weight, 0.75f);
    const std::vector<float> x = {1.0f, -2.5f, 3.0e-7f, 1e30f, -0.0f, 7.0f};
    ASSERT_EQ(r->hidden.size(), x.size());
    EXPECT_EQ(std::memcmp(r->hidden.data(), x.data(), x.size() * 4), 0);  // bit for bit, -0 included
    EXPECT_EQ(r->rows[1].route_offset, 2u);
    EXPECT_EQ(r->rows[1].route_count, 1u);
}

TEST(Wire, ResponseAndErrorRoundTrip) {
    frame_header h;
    h.placement_version = 9;
    h.request_id = 5;
    h.layer = 3;
    h.rows = 2;
    h.dim = 2;
    h.executor = 4;
    h.tp_rank = 1;
    h.tp = 3;
    const std::vector<float> p = {0.5f, -1.0f, std::nextafter(1.0f, 2.0f), 3.0f};
    auto r = decode_response(encode_response(h, p.data()));
    ASSERT_TRUE(r) << r.status().to_string();
    EXPECT_EQ(r->partial, p);
    EXPECT_EQ(r->h.executor, 4u);
    EXPECT_EQ(r->h.tp_rank, 1);
    EXPECT_EQ(r->h.tp, 3);
    response_expectation e{9, 5, 3, 2, 2, 4, 1, 3};
    EXPECT_TRUE(check_response(r->h, e));

    Status st = decode_error(encode_error(h, Status::invalid_argument("wrong layer 3: worker 4 holds layers [1]")));
    EXPECT_EQ(st.code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(st.message(), "wrong layer 3: worker 4 holds layers [1]");
}

TEST(Wire, TruncatedFramesAreRefused) {
    frame_bytes f = sample_request();
    frame_bytes head(f.begin(), f.begin() + 40);
    auto h = decode_frame(head);
    ASSERT_FALSE(h);
    EXPECT_EQ(h.status().code(), status_code::CORRUPTION);
    EXPECT_NE(reason(h.status()).find("truncated: header has 40 of 64"), std::string::npos) << reason(h.status());
    frame_bytes body(f.begin(), f.end() - 5);
    h = decode_frame(body);
    ASSERT_FALSE(h);
    EXPECT_NE(reason(h.status()).find("truncated: payload"), std::string::npos) << reason(h.status());
}

TEST(Wire, BadMagicVersionKindDtypeAndFlagsAreRefused) {
    frame_bytes f = sample_request();
    f[0] = 'X';
    EXPECT_NE(reason(decode_frame(f).status()).find("bad magic"), std::string::npos);

    f = sample_request();
    f[4] = 2;  // protocol version 2, properly sealed: a newer peer
    reseal(f);
    EXPECT_NE(reason(decode_frame(f).status()).find("protocol version 2 (this build speaks 1)"), std::string::npos)
        << reason(decode_frame(f).status());

    f = sample_request();
    f[6] = 77;
    reseal(f);
    EXPECT_NE(reason(decode_frame(f).status()).find("unknown frame kind 77"), std::string::npos);

    f = sample_request();
    f[40] = 9;
    reseal(f);
    EXPECT_NE(reason(decode_frame(f).status()).find("unknown hidden dtype 9"), std::string::npos);

    f = sample_request();
    f[43] = 0x80;
    reseal(f);
    EXPECT_NE(reason(decode_frame(f).status()).find("unknown flags"), std::string::npos);
}

TEST(Wire, ChecksumMismatchesAreRefused) {
    frame_bytes f = sample_request();
    f[HEADER_BYTES + 40] ^= 0x01;  // one bit of the hidden payload
    auto h = decode_request(f);
    ASSERT_FALSE(h);
    EXPECT_EQ(reason(h.status()), "payload checksum mismatch");

    f = sample_request();
    f[25] ^= 0x10;  // the layer field, header not resealed
    h = decode_request(f);
    ASSERT_FALSE(h);
    EXPECT_EQ(reason(h.status()), "header checksum mismatch");
}

TEST(Wire, OversizeFramesAreRefused) {
    frame_bytes f = sample_request();
    put32(f, 52, uint32_t(MAX_PAYLOAD_BYTES + 1));
    reseal(f);
    auto h = decode_header(f.data(), f.size());
    ASSERT_FALSE(h);
    EXPECT_NE(reason(h.status()).find("oversize payload"), std::string::npos);

    f = sample_request();
    put32(f, 28, MAX_ROWS + 1);
    reseal(f);
    EXPECT_NE(reason(decode_header(f.data(), f.size()).status()).find("oversize frame"), std::string::npos);

    // A row claiming more routes than a row may have.
    frame_header hd;
    route_table rt;
    rt.offsets = {0, MAX_ROUTES_PER_ROW + 1};
    rt.routes.assign(MAX_ROUTES_PER_ROW + 1, {0, 1.0f});
    std::vector<float> x(4, 1.0f);
    auto r = decode_request(encode_request(hd, rt, x.data(), 4));
    ASSERT_FALSE(r);
    EXPECT_NE(reason(r.status()).find("oversize frame"), std::string::npos) << reason(r.status());
}

TEST(Wire, InconsistentStructureIsRefused) {
    // Payload length that does not match rows x dim (header and payload CRCs both right).
    frame_bytes f = sample_request();
    put32(f, 32, 4);  // dim 4 instead of 3
    reseal(f);
    auto r = decode_request(f);
    ASSERT_FALSE(r);
    EXPECT_NE(reason(r.status()).find("need"), std::string::npos) << reason(r.status());

    // Row descriptors whose route ranges overlap.
    f = sample_request();
    put32(f, HEADER_BYTES + ROW_DESC_BYTES + 8, 1);  // row 1 starts at route 1, inside row 0's
    const size_t n = f.size() - HEADER_BYTES;
    uint32_t c = uint32_t(crc32(crc32(0L, Z_NULL, 0), f.data() + HEADER_BYTES, uInt(n)));
    put32(f, 56, c);
    reseal(f);
    r = decode_request(f);
    ASSERT_FALSE(r);
    EXPECT_NE(reason(r.status()).find("row 1: routes"), std::string::npos) << reason(r.status());

    // A response parsed as a request.
    frame_header h;
    h.rows = 1;
    h.dim = 1;
    float one = 1;
    r = decode_request(encode_response(h, &one));
    ASSERT_FALSE(r);
    EXPECT_NE(reason(r.status()).find("expected EXPERT_REQUEST, got EXPERT_RESPONSE"), std::string::npos);
}

TEST(Wire, MismatchedResponsesAreRefusedWithTheField) {
    frame_header h;
    h.placement_version = 0xabc;
    h.request_id = 5;
    h.layer = 3;
    h.rows = 1;
    h.dim = 2;
    h.executor = 1;
    h.tp_rank = 1;
    h.tp = 2;
    response_expectation e{0xdef, 5, 3, 1, 2, 1, 1, 2};
    Status st = check_response(h, e);
    ASSERT_FALSE(st);
    EXPECT_EQ(reason(st), "stale placement version 0x0000000000000abc (expected 0x0000000000000def)");
    e.placement_version = 0xabc;
    e.layer = 4;
    EXPECT_EQ(reason(check_response(h, e)), "wrong layer 3 (expected 4)");
    e.layer = 3;
    e.request_id = 6;
    EXPECT_EQ(reason(check_response(h, e)), "request id 5 (expected 6)");
    e.request_id = 5;
    e.tp_rank = 0;
    EXPECT_NE(reason(check_response(h, e)).find("executor 1 rank 1/2 (expected 1 rank 0/2)"), std::string::npos);
    e.tp_rank = 1;
    EXPECT_TRUE(check_response(h, e));
}

}  // namespace
}  // namespace ds41rt::dist
