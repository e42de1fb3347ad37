#include "dist/wire.h"

#include <array>
#include <cmath>
#include <cstring>

#include "dist/le_bytes.h"

namespace ds41rt::dist {

using namespace le;

namespace {

using backend::cpu::route;
using backend::cpu::route_table;

std::string hex(uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
    return buf;
}

bool known_kind(uint16_t k) { return k >= uint16_t(frame_kind::HELLO) && k <= uint16_t(frame_kind::NCCL_BOOTSTRAP_REPLY); }

void write_header(const frame_header &h, uint8_t *p) {
    std::memset(p, 0, HEADER_BYTES);
    put32(p + 0, WIRE_MAGIC);
    put16(p + 4, h.version);
    put16(p + 6, uint16_t(h.kind));
    put64(p + 8, h.placement_version);
    put64(p + 16, h.request_id);
    put32(p + 24, h.layer);
    put32(p + 28, h.rows);
    put32(p + 32, h.dim);
    put32(p + 36, h.routes);
    p[40] = uint8_t(h.hidden_dtype);
    p[41] = uint8_t(h.partial_dtype);
    put16(p + 42, h.flags);
    put16(p + 44, h.status);
    p[46] = h.tp_rank;
    p[47] = h.tp;
    put32(p + 48, h.executor);
    put32(p + 52, h.payload_bytes);
    put32(p + 56, h.payload_crc);
    put32(p + 60, crc(p, 60));
}

frame_bytes finish(frame_header h, const std::vector<uint8_t> &payload) {
    h.payload_bytes = uint32_t(payload.size());
    h.payload_crc = crc(payload.data(), payload.size());
    std::array<uint8_t, HEADER_BYTES> head;
    write_header(h, head.data());
    frame_bytes f(HEADER_BYTES + payload.size());
    std::copy(head.begin(), head.end(), f.begin());
    std::copy(payload.begin(), payload.end(), f.begin() + long(HEADER_BYTES));
    return f;
}

Status truncated(const std::string &what, size_t have, size_t need) {
    return Status::corruption("frame truncated: " + what + " has " + std::to_string(have) + " of " +
                              std::to_string(need) + " bytes");
}

}  // namespace

const char *frame_kind_name(frame_kind k) {
    switch (k) {
    case frame_kind::HELLO: return "HELLO";
    case frame_kind::HELLO_REPLY: return "HELLO_REPLY";
    case frame_kind::EXPERT_REQUEST: return "EXPERT_REQUEST";
    case frame_kind::EXPERT_RESPONSE: return "EXPERT_RESPONSE";
    case frame_kind::ERROR: return "ERROR";
    case frame_kind::NCCL_BOOTSTRAP: return "NCCL_BOOTSTRAP";
    case frame_kind::NCCL_BOOTSTRAP_REPLY: return "NCCL_BOOTSTRAP_REPLY";
    }
    return "unknown";
}

// ---- encoding ---------------------------------------------------------------------------------

frame_bytes encode_frame(frame_header h, const std::vector<uint8_t> &payload) { return finish(h, payload); }

frame_bytes encode_hello(frame_kind kind, uint64_t placement_version, uint32_t executor, uint8_t tp_rank, uint8_t tp) {
    frame_header h;
    h.kind = kind;
    h.placement_version = placement_version;
    h.executor = executor;
    h.tp_rank = tp_rank;
    h.tp = tp;
    return finish(h, {});
}

frame_bytes encode_request(frame_header h, const route_table &rt, const float *hidden, uint32_t dim) {
    const size_t rows = size_t(rt.rows()), routes = rt.routes.size();
    h.kind = frame_kind::EXPERT_REQUEST;
    h.rows = uint32_t(rows);
    h.dim = dim;
    h.routes = uint32_t(routes);
    h.hidden_dtype = wire_dtype::F32;
    h.partial_dtype = wire_dtype::F32;
    std::vector<uint8_t> pl(rows * ROW_DESC_BYTES + routes * ROUTE_BYTES + rows * dim * 4);
    uint8_t *p = pl.data();
    for (size_t r = 0; r < rows; r++, p += ROW_DESC_BYTES) {
        put32(p, uint32_t(r));
        put32(p + 4, UINT32_MAX);
        put32(p + 8, rt.offsets[r]);
        put32(p + 12, rt.offsets[r + 1] - rt.offsets[r]);
    }
    for (const route &e : rt.routes) {
        put32(p, e.expert);
        putf(p + 4, e.weight);
        p += ROUTE_BYTES;
    }
    for (size_t i = 0; i < rows * dim; i++, p += 4) putf(p, hidden[i]);
    return finish(h, pl);
}

frame_bytes encode_response(frame_header h, const float *partial) {
    h.kind = frame_kind::EXPERT_RESPONSE;
    h.flags = 0;  // request-only
    h.routes = 0;
    h.hidden_dtype = wire_dtype::NONE;
    h.partial_dtype = wire_dtype::F32;
    h.status = 0;
    std::vector<uint8_t> pl(size_t(h.rows) * h.dim * 4);
    for (size_t i = 0; i < size_t(h.rows) * h.dim; i++) putf(pl.data() + 4 * i, partial[i]);
    return finish(h, pl);
}

frame_bytes encode_error(frame_header h, const Status &st) {
    h.kind = frame_kind::ERROR;
    h.flags = 0;
    h.rows = h.dim = h.routes = 0;
    h.hidden_dtype = h.partial_dtype = wire_dtype::NONE;
    h.status = uint16_t(st.code());
    std::string m = st.message().substr(0, MAX_REASON_BYTES);
    return finish(h, std::vector<uint8_t>(m.begin(), m.end()));
}

// ---- decoding ---------------------------------------------------------------------------------

Result<frame_header> decode_header(const uint8_t *p, size_t n) {
    if (n < HEADER_BYTES) return truncated("header", n, HEADER_BYTES);
    if (get32(p) != WIRE_MAGIC) return Status::corruption("bad magic " + hex(get32(p)) + " (not a DS41RT expert frame)");
    frame_header h;
    h.version = get16(p + 4);
    if (h.version != PROTOCOL_VERSION)
        return Status::corruption("protocol version " + std::to_string(h.version) + " (this build speaks " +
                                  std::to_string(PROTOCOL_VERSION) + ")");
    if (get32(p + 60) != crc(p, 60)) return Status::corruption("header checksum mismatch");
    const uint16_t kind = get16(p + 6);
    if (!known_kind(kind)) return Status::corruption("unknown frame kind " + std::to_string(kind));
    h.kind = frame_kind(kind);
    h.placement_version = get64(p + 8);
    h.request_id = get64(p + 16);
    h.layer = get32(p + 24);
    h.rows = get32(p + 28);
    h.dim = get32(p + 32);
    h.routes = get32(p + 36);
    if (p[40] > uint8_t(wire_dtype::F32)) return Status::corruption("unknown hidden dtype " + std::to_string(p[40]));
    if (p[41] > uint8_t(wire_dtype::F32)) return Status::corruption("unknown partial dtype " + std::to_string(p[41]));
    h.hidden_dtype = wire_dtype(p[40]);
    h.partial_dtype = wire_dtype(p[41]);
    h.flags = get16(p + 42);
    h.status = get16(p + 44);
    h.tp_rank = p[46];
    h.tp = p[47];
    h.executor = get32(p + 48);
    h.payload_bytes = get32(p + 52);
    h.payload_crc = get32(p + 56);
    if (h.payload_bytes > MAX_PAYLOAD_BYTES)
        return Status::corruption("oversize payload: " + std::to_string(h.payload_bytes) + " bytes (limit " +
                                  std::to_string(MAX_PAYLOAD_BYTES) + ")");
    if (h.rows > MAX_ROWS) return Status::corruption("oversize frame: " + std::to_string(h.rows) + " rows (limit " + std::to_string(MAX_ROWS) + ")");
    if (h.dim > MAX_DIM) return Status::corruption("oversize frame: dim " + std::to_string(h.dim) + " (limit " + std::to_string(MAX_DIM) + ")");
    if (h.flags & ~KNOWN_FLAGS) return Status::corruption("unknown flags " + hex(h.flags & ~KNOWN_FLAGS));
    return h;
}

Status check_payload(const frame_header &h, const uint8_t *payload, size_t n) {
    if (n < h.payload_bytes) return truncated("payload", n, h.payload_bytes);
    if (n > h.payload_bytes)
        return Status::corruption("payload has " + std::to_string(n) + " bytes, header says " +
                                  std::to_string(h.payload_bytes));
    if (crc(payload, n) != h.payload_crc) return Status::corruption("payload checksum mismatch");
    return Status::ok();
}

Result<frame_header> decode_frame(const frame_bytes &f) {
    auto h = decode_header(f.data(), f.size());
    if (!h) return h.status();
    DS41RT_RETURN_IF_ERROR(check_payload(*h, f.data() + HEADER_BYTES, f.size() - HEADER_BYTES));
    const frame_header &hd = *h;
    const uint64_t cells = uint64_t(hd.rows) * hd.dim;
    switch (hd.kind) {
    case frame_kind::HELLO:
    case frame_kind::HELLO_REPLY:
        if (hd.payload_bytes != 0) return Status::corruption(std::string(frame_kind_name(hd.kind)) + " with a payload");
        break;
    case frame_kind::EXPERT_REQUEST: {
        if (hd.hidden_dtype != wire_dtype::F32 || hd.partial_dtype != wire_dtype::F32)
            return Status::not_supported("request dtypes: hidden " + std::to_string(int(hd.hidden_dtype)) +
                                         ", partial " + std::to_string(int(hd.partial_dtype)) + " (only F32 is served)");
        if (uint64_t(hd.routes) > uint64_t(hd.rows) * MAX_ROUTES_PER_ROW)
            return Status::corruption("oversize frame: " + std::to_string(hd.routes) + " routes for " +
                                      std::to_string(hd.rows) + " rows");
        const uint64_t need = uint64_t(hd.rows) * ROW_DESC_BYTES + uint64_t(hd.routes) * ROUTE_BYTES + cells * 4;
        if (need != hd.payload_bytes)
            return Status::corruption("request payload is " + std::to_string(hd.payload_bytes) + " bytes, its " +
                                      std::to_string(hd.rows) + " rows x dim " + std::to_string(hd.dim) + " and " +
                                      std::to_string(hd.routes) + " routes need " + std::to_string(need));
        break;
    }
    case frame_kind::EXPERT_RESPONSE:
        if (hd.partial_dtype != wire_dtype::F32)
            return Status::not_supported("response partial dtype " + std::to_string(int(hd.partial_dtype)));
        if (cells * 4 != hd.payload_bytes)
            return Status::corruption("response payload is " + std::to_string(hd.payload_bytes) + " bytes, " +
                                      std::to_string(hd.rows) + " rows x dim " + std::to_string(hd.dim) +
                                      " need " + std::to_string(cells * 4));
        break;
    case frame_kind::ERROR:
        if (hd.payload_bytes > MAX_REASON_BYTES) return Status::corruption("oversize error reason");
        break;
    case frame_kind::NCCL_BOOTSTRAP:
    case frame_kind::NCCL_BOOTSTRAP_REPLY: break;  // dist/nccl_wire.cpp checks these payloads
    }
    return h;
}

Result<expert_request> decode_request(const frame_bytes &f) {
    auto h = decode_frame(f);
    if (!h) return h.status();
    if (h->kind != frame_kind::EXPERT_REQUEST)
        return Status::corruption(std::string("expected EXPERT_REQUEST, got ") + frame_kind_name(h->kind));
    expert_request r;
    r.h = *h;
    const uint8_t *p = f.data() + HEADER_BYTES;
    r.rows.resize(h->rows);
    r.routes.offsets.assign(size_t(h->rows) + 1, 0);
    uint32_t next = 0;
    for (uint32_t i = 0; i < h->rows; i++, p += ROW_DESC_BYTES) {
        row_desc &d = r.rows[i];
        d.row_id = get32(p);
        d.position = get32(p + 4);
        d.route_offset = get32(p + 8);
        d.route_count = get32(p + 12);
        if (d.route_offset != next || d.route_count > MAX_ROUTES_PER_ROW || uint64_t(next) + d.route_count > h->routes)
            return Status::corruption("row " + std::to_string(i) + ": routes [" + std::to_string(d.route_offset) + ", +" +
                                      std::to_string(d.route_count) + ") do not follow the previous rows' (" +
                                      std::to_string(next) + " of " + std::to_string(h->routes) + ")");
        next += d.route_count;
        r.routes.offsets[i + 1] = next;
    }
    if (next != h->routes)
        return Status::corruption("rows use " + std::to_string(next) + " of " + std::to_string(h->routes) + " routes");
    r.routes.routes.resize(h->routes);
    for (uint32_t i = 0; i < h->routes; i++, p += ROUTE_BYTES) {
        r.routes.routes[i].expert = get32(p);
        r.routes.routes[i].weight = getf(p + 4);
        if (!std::isfinite(r.routes.routes[i].weight))
            return Status::corruption("route " + std::to_string(i) + " has a non-finite gate weight");
    }
    r.hidden.resize(size_t(h->rows) * h->dim);
    for (size_t i = 0; i < r.hidden.size(); i++, p += 4) r.hidden[i] = getf(p);
    return r;
}

Result<expert_response> decode_response(const frame_bytes &f) {
    auto h = decode_frame(f);
    if (!h) return h.status();
    if (h->kind != frame_kind::EXPERT_RESPONSE)
        return Status::corruption(std::string("expected EXPERT_RESPONSE, got ") + frame_kind_name(h->kind));
    expert_response r;
    r.h = *h;
    r.partial.resize(size_t(h->rows) * h->dim);
    const uint8_t *p = f.data() + HEADER_BYTES;
    for (size_t i = 0; i < r.partial.size(); i++) r.partial[i] = getf(p + 4 * i);
    return r;
}

Status decode_error(const frame_bytes &f) {
    auto h = decode_frame(f);
    if (!h) return h.status();
    if (h->kind != frame_kind::ERROR)
        return Status::corruption(std::string("expected ERROR, got ") + frame_kind_name(h->kind));
    std::string reason(f.begin() + HEADER_BYTES, f.end());
    status_code code = h->status <= uint16_t(status_code::INTERNAL) && h->status != 0 ? status_code(h->status)
                                                                                      : status_code::UNAVAILABLE;
    return Status(code, reason);
}

Status check_response(const frame_header &h, const response_expectation &e) {
    if (h.placement_version != e.placement_version)
        return Status::corruption("stale placement version " + hex(h.placement_version) + " (expected " +
                                  hex(e.placement_version) + ")");
    if (h.request_id != e.request_id)
        return Status::corruption("request id " + std::to_string(h.request_id) + " (expected " +
                                  std::to_string(e.request_id) + ")");
    if (h.layer != e.layer)
        return Status::corruption("wrong layer " + std::to_string(h.layer) + " (expected " + std::to_string(e.layer) + ")");
    if (h.executor != e.executor || h.tp_rank != e.tp_rank || h.tp != e.tp)
        return Status::corruption("executor " + std::to_string(h.executor) + " rank " + std::to_string(h.tp_rank) + "/" +
                                  std::to_string(h.tp) + " (expected " + std::to_string(e.executor) + " rank " +
                                  std::to_string(e.tp_rank) + "/" + std::to_string(e.tp) + ")");
    if (h.kind == frame_kind::EXPERT_RESPONSE && (h.rows != e.rows || h.dim != e.dim))
        return Status::corruption("response geometry " + std::to_string(h.rows) + " x " + std::to_string(h.dim) +
                                  " (expected " + std::to_string(e.rows) + " x " + std::to_string(e.dim) + ")");
    return Status::ok();
}

}  // namespace ds41rt::dist
