#include "dist/nccl_wire.h"

#include <cstring>
#include <vector>

#include "dist/le_bytes.h"

namespace ds41rt::dist {

using namespace le;

frame_bytes encode_nccl_bootstrap(const nccl_bootstrap &b) {
    frame_header h;
    h.kind = frame_kind::NCCL_BOOTSTRAP;
    h.placement_version = b.placement_version;
    h.executor = b.executor;
    std::vector<uint8_t> pl(NCCL_BOOTSTRAP_BYTES, 0);
    put16(pl.data(), NCCL_BOOTSTRAP_VERSION);
    put16(pl.data() + 2, 2);
    put16(pl.data() + 4, 1);
    std::memcpy(pl.data() + 8, b.id.data(), NCCL_ID_BYTES);
    return encode_frame(h, pl);
}

Result<nccl_bootstrap> decode_nccl_bootstrap(const frame_bytes &f, uint64_t placement_version) {
    auto h = decode_frame(f);
    if (!h) return h.status();
    if (h->kind != frame_kind::NCCL_BOOTSTRAP)
        return Status::corruption(std::string("expected NCCL_BOOTSTRAP, got ") + frame_kind_name(h->kind));
    if (h->payload_bytes != NCCL_BOOTSTRAP_BYTES)
        return Status::corruption("NCCL_BOOTSTRAP payload is " + std::to_string(h->payload_bytes) + " bytes, expected " +
                                  std::to_string(NCCL_BOOTSTRAP_BYTES));
    const uint8_t *p = f.data() + HEADER_BYTES;
    if (get16(p) != NCCL_BOOTSTRAP_VERSION)
        return Status::corruption("NCCL bootstrap version " + std::to_string(get16(p)) + " (this build speaks " +
                                  std::to_string(NCCL_BOOTSTRAP_VERSION) + ")");
    if (get16(p + 2) != 2 || get16(p + 4) != 1)
        return Status::corruption("NCCL bootstrap for rank " + std::to_string(get16(p + 4)) + " of " +
                                  std::to_string(get16(p + 2)) + " (workers are rank 1 of 2)");
    if (h->placement_version != placement_version)
        return Status::unavailable("stale placement version: the NCCL bootstrap has " + std::to_string(h->placement_version) +
                                   ", this side runs " + std::to_string(placement_version));
    nccl_bootstrap b;
    b.placement_version = h->placement_version;
    b.executor = h->executor;
    std::memcpy(b.id.data(), p + 8, NCCL_ID_BYTES);
    return b;
}

void encode_nccl_header(const nccl_header &h, uint8_t out[NCCL_HEADER_BYTES]) {
    std::memset(out, 0, NCCL_HEADER_BYTES);
    put32(out, NCCL_MAGIC);
    put16(out + 4, h.version);
    put16(out + 6, h.flags);
    put64(out + 8, h.placement_version);
    put64(out + 16, h.sequence);
    put32(out + 24, h.layer);
    put32(out + 28, h.rows);
    put32(out + 32, h.k);
    put32(out + 36, h.dim);
    out[40] = NCCL_DTYPE_F32;
    out[41] = NCCL_DTYPE_I32;
    out[42] = NCCL_DTYPE_F32;
    out[43] = NCCL_DTYPE_F32;
    put32(out + 44, h.executor);
    out[48] = h.tp_rank;
    out[49] = h.tp;
    put32(out + 60, crc(out, 60));
}

Result<nccl_header> decode_nccl_header(const uint8_t *p, size_t n) {
    if (n < NCCL_HEADER_BYTES)
        return Status::corruption("NCCL header truncated: " + std::to_string(n) + " of " +
                                  std::to_string(NCCL_HEADER_BYTES) + " bytes");
    if (get32(p) != NCCL_MAGIC) return Status::corruption("NCCL header: bad magic (not a DS41RT expert request)");
    nccl_header h;
    h.version = get16(p + 4);
    if (h.version != NCCL_PROTOCOL_VERSION)
        return Status::corruption("NCCL header: protocol version " + std::to_string(h.version) + " (this build speaks " +
                                  std::to_string(NCCL_PROTOCOL_VERSION) + ")");
    if (get32(p + 60) != crc(p, 60)) return Status::corruption("NCCL header: checksum mismatch");
    const uint8_t want[4] = {NCCL_DTYPE_F32, NCCL_DTYPE_I32, NCCL_DTYPE_F32, NCCL_DTYPE_F32};
    const char *names[4] = {"x", "ids", "weights", "partial"};
    for (int i = 0; i < 4; i++)
        if (p[40 + i] != want[i])
            return Status::corruption(std::string("NCCL header: ") + names[i] + " dtype " + std::to_string(p[40 + i]) +
                                      " (expected " + std::to_string(want[i]) + ")");
    h.flags = get16(p + 6);
    if (h.flags & ~KNOWN_FLAGS) return Status::corruption("NCCL header: unknown flags " + std::to_string(h.flags));
    h.placement_version = get64(p + 8);
    h.sequence = get64(p + 16);
    h.layer = get32(p + 24);
    h.rows = get32(p + 28);
    h.k = get32(p + 32);
    h.dim = get32(p + 36);
    h.executor = get32(p + 44);
    h.tp_rank = p[48];
    h.tp = p[49];
    if (h.rows == 0 || h.rows > MAX_ROWS)
        return Status::corruption("NCCL header: " + std::to_string(h.rows) + " rows (1.." + std::to_string(MAX_ROWS) + ")");
    if (h.k == 0 || h.k > MAX_ROUTES_PER_ROW)
        return Status::corruption("NCCL header: K " + std::to_string(h.k) + " (1.." + std::to_string(MAX_ROUTES_PER_ROW) + ")");
    if (h.dim == 0 || h.dim > MAX_DIM)
        return Status::corruption("NCCL header: dim " + std::to_string(h.dim) + " (1.." + std::to_string(MAX_DIM) + ")");
    return h;
}

std::string nccl_reply_reason(int32_t status) {
    switch (nccl_reply(status)) {
    case nccl_reply::OK: return "ok";
    case nccl_reply::STALE_PLACEMENT: return "stale placement version";
    case nccl_reply::LAYER_NOT_HELD: return "layer not held by this worker";
    case nccl_reply::BAD_HEADER: return "bad header (dim, TP rank or executor not this worker's)";
    case nccl_reply::EXPERTS_FAILED: return "the worker's expert arithmetic failed";
    }
    return "unknown status " + std::to_string(status);
}

}  // namespace ds41rt::dist
