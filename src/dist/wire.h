// The expert wire protocol: the frames the coordinator and the expert workers exchange, whatever
// the transport. docs/design.md section 9 has the byte table; this header is its code.
//
// A frame is a 64-byte header followed by `payload_bytes` of payload. Every integer is
// little-endian (written byte by byte, so the host's order never matters), floats are IEEE-754
// binary32 in the same byte order. Both the header (bytes 0..59) and the payload carry a CRC-32
// (zlib's, the IEEE polynomial), so a flipped bit anywhere is refused rather than computed with.
//
//   off size field             off size field
//   0   4    magic "DS4W"      40  1    hidden dtype (1 = F32)
//   4   2    protocol version  41  1    partial dtype (1 = F32)
//   6   2    kind              42  2    flags (request only; workers echo none)
//   8   8    placement version 44  2    status (responses: core status_code)
//   16  8    request id        46  1    TP rank of the executor
//   24  4    layer             47  1    TP width
//   28  4    rows              48  4    executor id (the worker's index in the plan)
//   32  4    hidden dim        52  4    payload bytes
//   36  4    route entries     56  4    payload CRC-32
//                              60  4    header CRC-32 of bytes 0..59
//
// Payloads by kind:
//   HELLO, HELLO_REPLY: empty (the header says who and which placement);
//   EXPERT_REQUEST: rows x 16-byte row descriptors (u32 row id, u32 token position, u32 route
//     offset, u32 route count), then route entries x 8 bytes (u32 expert id, f32 gate weight),
//     then rows x dim hidden values (the rows after the FFN norm);
//   EXPERT_RESPONSE: rows x dim partial values (this rank's sum over each row's routes);
//   ERROR: a UTF-8 reason (at most MAX_REASON_BYTES);
//   NCCL_BOOTSTRAP, NCCL_BOOTSTRAP_REPLY: dist/nccl_wire.h.
//
// Decoding refuses, with a Status naming the field: a short header or payload (truncated), a
// wrong magic, another protocol version, an unknown kind or dtype, a header or payload checksum
// mismatch, sizes over the limits below, and payload lengths or route tables that do not add up.
// Whether a well-formed frame is the one expected (placement version, layer, request id,
// executor) is check_response() / the worker's business, with their own reasons.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/routed.h"
#include "core/status.h"

namespace ds41rt::dist {

constexpr uint32_t WIRE_MAGIC = 0x57345344;  // "DS4W" as little-endian bytes
constexpr uint16_t PROTOCOL_VERSION = 1;
constexpr size_t HEADER_BYTES = 64;
constexpr size_t MAX_PAYLOAD_BYTES = size_t(64) << 20;  // one frame's budget (the reference's 64 MiB)
constexpr uint32_t MAX_ROWS = 1u << 16;
constexpr uint32_t MAX_DIM = 1u << 16;
constexpr uint32_t MAX_ROUTES_PER_ROW = 64;
constexpr size_t MAX_REASON_BYTES = 4096;
constexpr size_t ROW_DESC_BYTES = 16, ROUTE_BYTES = 8;

// NCCL_BOOTSTRAP / NCCL_BOOTSTRAP_REPLY open a GPU worker's NCCL data path over this control
// channel (payload and rules: dist/nccl_wire.h).
enum class frame_kind : uint16_t {
    HELLO = 1,
    HELLO_REPLY = 2,
    EXPERT_REQUEST = 3,
    EXPERT_RESPONSE = 4,
    ERROR = 5,
    NCCL_BOOTSTRAP = 6,
    NCCL_BOOTSTRAP_REPLY = 7,
};
enum class wire_dtype : uint8_t { NONE = 0, F32 = 1 };

// Request flags: the numerics the worker must reproduce (engine numerics::OFFICIAL, and V4's
// transformers rule of scaling w2's output by the gate weight).
constexpr uint16_t FLAG_OFFICIAL = 1u << 0;
constexpr uint16_t FLAG_WEIGHT_AFTER_W2 = 1u << 1;
constexpr uint16_t KNOWN_FLAGS = FLAG_OFFICIAL | FLAG_WEIGHT_AFTER_W2;

const char *frame_kind_name(frame_kind k);

struct frame_header {
    uint16_t version = PROTOCOL_VERSION;
    frame_kind kind = frame_kind::HELLO;
    uint64_t placement_version = 0;
    uint64_t request_id = 0;
    uint32_t layer = 0;
    uint32_t rows = 0;
    uint32_t dim = 0;
    uint32_t routes = 0;
    wire_dtype hidden_dtype = wire_dtype::NONE;
    wire_dtype partial_dtype = wire_dtype::NONE;
    uint16_t flags = 0;
    uint16_t status = 0;
    uint8_t tp_rank = 0;
    uint8_t tp = 0;
    uint32_t executor = 0;
    uint32_t payload_bytes = 0;
    uint32_t payload_crc = 0;
};

// A whole frame as it travels: header bytes then payload bytes.
using frame_bytes = std::vector<uint8_t>;

// Per-row descriptor of a request.
struct row_desc {
    uint32_t row_id = 0;
    uint32_t position = 0;  // token position, for logs; UINT32_MAX when unknown
    uint32_t route_offset = 0;
    uint32_t route_count = 0;
};

struct expert_request {
    frame_header h;  // kind EXPERT_REQUEST; rows, dim, routes and dtypes follow from the data
    std::vector<row_desc> rows;
    backend::cpu::route_table routes;
    std::vector<float> hidden;  // [rows, dim]
};

struct expert_response {
    frame_header h;
    std::vector<float> partial;  // [rows, dim]
};

// ---- encoding ---------------------------------------------------------------------------------
// Fills in the size, dtype and checksum fields of h from the payload.
frame_bytes encode_hello(frame_kind kind, uint64_t placement_version, uint32_t executor, uint8_t tp_rank = 0,
                         uint8_t tp = 0);
// Row descriptors are made from the route table (row id = index, position unknown).
frame_bytes encode_request(frame_header h, const backend::cpu::route_table &rt, const float *hidden, uint32_t dim);
frame_bytes encode_response(frame_header h, const float *partial);  // rows x dim from h
frame_bytes encode_error(frame_header h, const Status &st);         // h: the request answered
// Any kind with an opaque payload (the NCCL bootstrap frames).
frame_bytes encode_frame(frame_header h, const std::vector<uint8_t> &payload);

// ---- decoding ---------------------------------------------------------------------------------
// The header alone (magic, version, kind, dtypes, header CRC, size limits). n < HEADER_BYTES is
// "truncated".
Result<frame_header> decode_header(const uint8_t *p, size_t n);
// The payload against a decoded header: its length and CRC.
Status check_payload(const frame_header &h, const uint8_t *payload, size_t n);
// A whole frame: header, payload, and for the kinds with structure, the structure.
Result<frame_header> decode_frame(const frame_bytes &f);
Result<expert_request> decode_request(const frame_bytes &f);
Result<expert_response> decode_response(const frame_bytes &f);
// The reason an ERROR frame carries, as the Status it was sent as (UNAVAILABLE when its code is
// not one this build knows).
Status decode_error(const frame_bytes &f);

// What a coordinator expects back for one request to one rank; check_response names the first
// field that differs ("stale placement version 0x.. (expected 0x..)", "layer 3 (expected 2)").
struct response_expectation {
    uint64_t placement_version = 0;
    uint64_t request_id = 0;
    uint32_t layer = 0;
    uint32_t rows = 0;
    uint32_t dim = 0;
    uint32_t executor = 0;
    uint8_t tp_rank = 0;
    uint8_t tp = 0;
};
Status check_response(const frame_header &h, const response_expectation &e);

}  // namespace ds41rt::dist
