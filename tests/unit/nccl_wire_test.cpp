// The NCCL transport's wire (dist/nccl_wire.h): the NCCL_BOOTSTRAP control frame and the 64-byte
// data-path header round-trip, and each bad input is refused with its own reason: a stale
// placement version, a truncated frame or header, an unknown kind, bootstrap version, dtype or
// flag, a flipped bit, sizes out of range. The byte offsets checked here are the table in
// nccl_wire.h, written out by hand.
#include <gtest/gtest.h>

#include <zlib.h>

#include <numeric>
#include <tuple>

#include "dist/nccl_wire.h"
#include "dist/plan.h"

using namespace ds41rt;
using namespace ds41rt::dist;

namespace {

std::string reason(const Status &st) { return st.message(); }

nccl_bootstrap sample_bootstrap() {
    nccl_bootstrap b;
    b.placement_version = 0x1122334455667788ull;
    b.executor = 3;
    std::iota(b.id.begin(), b.id.end(), uint8_t(7));
    return b;
}

TEST(NcclWire, BootstrapRoundTrips) {
    const nccl_bootstrap b = sample_bootstrap();
    const frame_bytes f = encode_nccl_bootstrap(b);
    ASSERT_EQ(f.size(), HEADER_BYTES + NCCL_BOOTSTRAP_BYTES);
    EXPECT_EQ(f[6], 6);  // kind NCCL_BOOTSTRAP, little-endian at offset 6
    EXPECT_EQ(f[HEADER_BYTES + 0], 1);  // bootstrap version
    EXPECT_EQ(f[HEADER_BYTES + 2], 2);  // ranks
    EXPECT_EQ(f[HEADER_BYTES + 4], 1);  // the worker's rank
    EXPECT_EQ(f[HEADER_BYTES + 8], 7);  // the id's first byte
    auto d = decode_nccl_bootstrap(f, b.placement_version);
    ASSERT_TRUE(d) << d.status().to_string();
    EXPECT_EQ(d->executor, 3u);
    EXPECT_EQ(d->placement_version, b.placement_version);
    EXPECT_EQ(d->id, b.id);
}

TEST(NcclWire, BootstrapRefusesStaleTruncatedAndUnknown) {
    const nccl_bootstrap b = sample_bootstrap();
    const frame_bytes f = encode_nccl_bootstrap(b);
    // Stale: another plan.
    auto stale = decode_nccl_bootstrap(f, b.placement_version + 1);
    ASSERT_FALSE(stale);
    EXPECT_EQ(stale.status().code(), status_code::UNAVAILABLE);
    EXPECT_NE(reason(stale.status()).find("stale placement version"), std::string::npos) << reason(stale.status());
    // Truncated: the frame cut inside the id.
    frame_bytes cut(f.begin(), f.end() - 5);
    auto t = decode_nccl_bootstrap(cut, b.placement_version);
    ASSERT_FALSE(t);
    EXPECT_NE(reason(t.status()).find("truncated"), std::string::npos) << reason(t.status());
    // Truncated header.
    auto th = decode_nccl_bootstrap(frame_bytes(f.begin(), f.begin() + 30), b.placement_version);
    ASSERT_FALSE(th);
    EXPECT_NE(reason(th.status()).find("truncated"), std::string::npos) << reason(th.status());
    // A well-formed frame of another kind.
    auto other = decode_nccl_bootstrap(encode_hello(frame_kind::HELLO, b.placement_version, 3), b.placement_version);
    ASSERT_FALSE(other);
    EXPECT_NE(reason(other.status()).find("expected NCCL_BOOTSTRAP, got HELLO"), std::string::npos);
    // A short payload, correctly checksummed: its length is refused.
    frame_header h;
    h.kind = frame_kind::NCCL_BOOTSTRAP;
    h.placement_version = b.placement_version;
    auto shortp = decode_nccl_bootstrap(encode_frame(h, std::vector<uint8_t>(20, 0)), b.placement_version);
    ASSERT_FALSE(shortp);
    EXPECT_NE(reason(shortp.status()).find("payload is 20 bytes"), std::string::npos) << reason(shortp.status());
    // An unknown bootstrap version and an unknown communicator shape, correctly checksummed.
    std::vector<uint8_t> pl(f.begin() + HEADER_BYTES, f.end());
    pl[0] = 9;
    auto ver = decode_nccl_bootstrap(encode_frame(h, pl), b.placement_version);
    ASSERT_FALSE(ver);
    EXPECT_NE(reason(ver.status()).find("bootstrap version 9"), std::string::npos) << reason(ver.status());
    pl[0] = 1;
    pl[2] = 3;
    auto shape = decode_nccl_bootstrap(encode_frame(h, pl), b.placement_version);
    ASSERT_FALSE(shape);
    EXPECT_NE(reason(shape.status()).find("rank 1 of 3"), std::string::npos) << reason(shape.status());
    // An unknown frame kind in the control channel's header.
    frame_bytes k = f;
    k[6] = 42;
    auto unk = decode_nccl_bootstrap(k, b.placement_version);
    ASSERT_FALSE(unk);
    // Any flipped payload bit fails the frame's checksum.
    frame_bytes flip = f;
    flip[HEADER_BYTES + 40] ^= 0x10;
    auto fl = decode_nccl_bootstrap(flip, b.placement_version);
    ASSERT_FALSE(fl);
    EXPECT_NE(reason(fl.status()).find("checksum"), std::string::npos) << reason(fl.status());
}

nccl_header sample_header() {
    nccl_header h;
    h.flags = FLAG_OFFICIAL;
    h.placement_version = 0xabcdef0123456789ull;
    h.sequence = 77;
    h.layer = 41;
    h.rows = 16;
    h.k = 6;
    h.dim = 4096;
    h.executor = 2;
    h.tp_rank = 1;
    h.tp = 2;
    return h;
}

TEST(NcclWire, HeaderRoundTripsAtTheDocumentedOffsets) {
    uint8_t raw[NCCL_HEADER_BYTES];
    encode_nccl_header(sample_header(), raw);
    EXPECT_EQ(raw[0], 'D');
    EXPECT_EQ(raw[1], 'S');
    EXPECT_EQ(raw[2], '4');
    EXPECT_EQ(raw[3], 'N');
    EXPECT_EQ(raw[4], 1);     // protocol version
    EXPECT_EQ(raw[6], 1);     // flags: official
    EXPECT_EQ(raw[8], 0x89);  // placement version, low byte first
    EXPECT_EQ(raw[16], 77);   // sequence
    EXPECT_EQ(raw[24], 41);   // layer
    EXPECT_EQ(raw[28], 16);   // rows
    EXPECT_EQ(raw[32], 6);    // K
    EXPECT_EQ(raw[36], 0x00);
    EXPECT_EQ(raw[37], 0x10);  // dim 4096
    EXPECT_EQ(raw[40], 1);
    EXPECT_EQ(raw[41], 2);
    EXPECT_EQ(raw[42], 1);
    EXPECT_EQ(raw[43], 1);
    EXPECT_EQ(raw[44], 2);  // executor
    EXPECT_EQ(raw[48], 1);  // TP rank
    EXPECT_EQ(raw[49], 2);  // TP
    auto d = decode_nccl_header(raw, sizeof raw);
    ASSERT_TRUE(d) << d.status().to_string();
    EXPECT_EQ(d->placement_version, 0xabcdef0123456789ull);
    EXPECT_EQ(d->sequence, 77u);
    EXPECT_EQ(d->layer, 41u);
    EXPECT_EQ(d->rows, 16u);
    EXPECT_EQ(d->k, 6u);
    EXPECT_EQ(d->dim, 4096u);
    EXPECT_EQ(d->executor, 2u);
    EXPECT_EQ(d->tp_rank, 1);
    EXPECT_EQ(d->tp, 2);
    EXPECT_EQ(d->flags, FLAG_OFFICIAL);
    EXPECT_EQ(nccl_x_elems(*d), 16u * 4096u);
    EXPECT_EQ(nccl_route_elems(*d), 96u);
    EXPECT_EQ(nccl_reply_elems(*d), 16u * 4096u + 1u);
}

TEST(NcclWire, HeaderRefusesEachBadField) {
    uint8_t good[NCCL_HEADER_BYTES];
    encode_nccl_header(sample_header(), good);
    auto refused = [&](size_t n, const std::string &want) {
        auto d = decode_nccl_header(good, n);
        ASSERT_FALSE(d) << want;
        EXPECT_EQ(d.status().code(), status_code::CORRUPTION);
        EXPECT_NE(reason(d.status()).find(want), std::string::npos) << reason(d.status());
    };
    refused(63, "truncated: 63 of 64");
    // A flipped bit anywhere in 0..59 fails the checksum (or the magic, for bytes 0..3).
    for (size_t i : {size_t(10), size_t(28), size_t(50)}) {
        uint8_t bad[NCCL_HEADER_BYTES];
        std::copy(good, good + NCCL_HEADER_BYTES, bad);
        bad[i] ^= 1;
        auto d = decode_nccl_header(bad, NCCL_HEADER_BYTES);
        ASSERT_FALSE(d);
        EXPECT_NE(reason(d.status()).find("checksum"), std::string::npos) << i;
    }
    // Fields re-encoded with a valid checksum so only the field is wrong.
    auto with = [](nccl_header h) {
        std::vector<uint8_t> b(NCCL_HEADER_BYTES);
        encode_nccl_header(h, b.data());
        return b;
    };
    {
        uint8_t bad[NCCL_HEADER_BYTES];
        std::copy(good, good + NCCL_HEADER_BYTES, bad);
        bad[0] = 'X';
        auto d = decode_nccl_header(bad, NCCL_HEADER_BYTES);
        ASSERT_FALSE(d);
        EXPECT_NE(reason(d.status()).find("bad magic"), std::string::npos);
    }
    nccl_header h = sample_header();
    h.version = 2;
    auto v = with(h);
    auto dv = decode_nccl_header(v.data(), v.size());
    ASSERT_FALSE(dv);
    EXPECT_NE(reason(dv.status()).find("protocol version 2"), std::string::npos) << reason(dv.status());
    h = sample_header();
    h.flags = 0x80;
    auto f = with(h);
    auto df = decode_nccl_header(f.data(), f.size());
    ASSERT_FALSE(df);
    EXPECT_NE(reason(df.status()).find("unknown flags"), std::string::npos);
    for (auto [rows, k, dim, want] : {std::tuple{0u, 6u, 4096u, "0 rows"}, std::tuple{MAX_ROWS + 1, 6u, 4096u, "rows"},
                                      std::tuple{1u, 0u, 4096u, "K 0"}, std::tuple{1u, MAX_ROUTES_PER_ROW + 1, 4096u, "K "},
                                      std::tuple{1u, 6u, 0u, "dim 0"}, std::tuple{1u, 6u, MAX_DIM + 1, "dim "}}) {
        h = sample_header();
        h.rows = rows, h.k = k, h.dim = dim;
        auto b = with(h);
        auto d = decode_nccl_header(b.data(), b.size());
        ASSERT_FALSE(d) << want;
        EXPECT_NE(reason(d.status()).find(want), std::string::npos) << reason(d.status());
    }
    // An unknown dtype tag, re-checksummed (zlib's CRC-32 of bytes 0..59, as the table says).
    uint8_t dt[NCCL_HEADER_BYTES];
    std::copy(good, good + NCCL_HEADER_BYTES, dt);
    dt[41] = 7;
    const uint32_t c = uint32_t(crc32(crc32(0L, Z_NULL, 0), dt, 60));
    for (int b = 0; b < 4; b++) dt[60 + b] = uint8_t(c >> (8 * b));
    auto ddt = decode_nccl_header(dt, NCCL_HEADER_BYTES);
    ASSERT_FALSE(ddt);
    EXPECT_NE(reason(ddt.status()).find("ids dtype 7"), std::string::npos) << reason(ddt.status());
}

TEST(NcclWire, StatusWordsNameTheirReason) {
    EXPECT_EQ(nccl_reply_reason(0), "ok");
    EXPECT_NE(nccl_reply_reason(1).find("stale placement"), std::string::npos);
    EXPECT_NE(nccl_reply_reason(2).find("layer not held"), std::string::npos);
    EXPECT_NE(nccl_reply_reason(3).find("bad header"), std::string::npos);
    EXPECT_NE(nccl_reply_reason(4).find("arithmetic failed"), std::string::npos);
    EXPECT_EQ(nccl_reply_reason(17), "unknown status 17");
}

TEST(NcclWire, PlanCarriesTheTransportOnlyWhenNotTcp) {
    Plan p;
    p.model_type = "deepseek_v41";
    p.format = "official";
    p.num_layers = 2;
    p.coordinator.push_back({"gpu0", 0, {}});
    p.workers.push_back({"127.0.0.1:9000", 1, {"worker0", 0, {}}});
    p.layers.push_back({0, false, 0, {}});
    p.layers.push_back({1, true, 0, {0}});
    const std::string tcp_json = to_json(p);
    EXPECT_EQ(tcp_json.find("transport"), std::string::npos);  // old plans keep their versions
    const uint64_t v_tcp = p.version();
    p.workers[0].transport = "nccl";
    const std::string nccl_json = to_json(p);
    EXPECT_NE(nccl_json.find("\"transport\": \"nccl\""), std::string::npos);
    EXPECT_NE(p.version(), v_tcp);
    auto back = parse_plan(nccl_json);
    ASSERT_TRUE(back) << back.status().to_string();
    EXPECT_EQ(back->workers[0].transport, "nccl");
    EXPECT_TRUE(validate(*back));
    p.workers[0].transport = "carrier-pigeon";
    EXPECT_NE(reason(validate(p)).find("carrier-pigeon"), std::string::npos);
    p.workers[0].transport = "nccl";
    p.workers[0].device = -1;
    EXPECT_NE(reason(validate(p)).find("needs a GPU worker"), std::string::npos);
}

}  // namespace
