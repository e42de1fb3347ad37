// What the NCCL transport puts on the wire: the bootstrap frames that open a GPU worker's NCCL
// data path over the TCP control channel, and the fixed 64-byte header that leads every expert
// request on that data path. Pure host code (no NCCL, no CUDA), so the CPU tests check it.
//
// Bootstrap (control channel, wire.h frames, after HELLO): the coordinator sends NCCL_BOOTSTRAP
// with its placement version and the worker's index as executor; the payload is
//   off 0 u16 bootstrap version (1)   off 2 u16 ranks (2)   off 4 u16 the worker's rank (1)
//   off 6 u16 zero                    off 8 128 bytes: the ncclUniqueId (opaque)
// The worker answers NCCL_BOOTSTRAP_REPLY (empty, its placement version and index), or ERROR,
// and both sides then join the 2-rank communicator. One communicator per (coordinator, worker)
// pair: NCCL refuses two ranks of one communicator on one GPU, and several worker processes may
// share a GPU.
//
// Data path (NCCL, per TP rank, one ncclGroupStart/End on the coordinator's stream):
//   coordinator -> worker: this 64-byte header (uint8), then x [rows, dim] f32, ids [rows, K]
//     i32, weights [rows, K] f32 (the router's outputs: expert ids and exact gate weights);
//   worker -> coordinator: partial [rows, dim] f32, then one status word (i32 in an f32 slot,
//     nccl_reply below), rows * dim + 1 elements in all.
//   off size field               off size field
//   0   4    magic "DS4N"        40  1    x dtype (1 = F32)
//   4   2    protocol version    41  1    ids dtype (2 = I32)
//   6   2    flags (wire.h)      42  1    weights dtype (1 = F32)
//   8   8    placement version   43  1    partial dtype (1 = F32)
//   16  8    request sequence    44  4    executor (the worker's index in the plan)
//   24  4    layer               48  1    TP rank, 49 1 TP width
//   28  4    rows                50  10   zero
//   32  4    K (routes per row)  60  4    CRC-32 of bytes 0..59
//   36  4    dim
// A header that does not decode (wrong magic, version, checksum, dtype, sizes over the limits)
// leaves the worker unable to know the payload's size: it aborts the communicator and hangs up
// the control channel. One that decodes but does not fit the worker (stale placement, a layer it
// does not hold, another dim or TP rank) is drained and answered with a non-zero status.
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "dist/wire.h"

namespace ds41rt::dist {

constexpr size_t NCCL_ID_BYTES = 128;  // sizeof(ncclUniqueId), NCCL_UNIQUE_ID_BYTES
using nccl_id = std::array<uint8_t, NCCL_ID_BYTES>;

constexpr uint16_t NCCL_BOOTSTRAP_VERSION = 1;
constexpr size_t NCCL_BOOTSTRAP_BYTES = 8 + NCCL_ID_BYTES;

struct nccl_bootstrap {
    uint64_t placement_version = 0;
    uint32_t executor = 0;  // the worker's index in the plan
    nccl_id id{};
};

frame_bytes encode_nccl_bootstrap(const nccl_bootstrap &b);
// Refuses another kind, a truncated or oversize payload, another bootstrap version or
// communicator shape, and a placement version other than `placement_version` (stale plan).
Result<nccl_bootstrap> decode_nccl_bootstrap(const frame_bytes &f, uint64_t placement_version);

// ---- the data-path header --------------------------------------------------------------------

constexpr uint32_t NCCL_MAGIC = 0x4e345344;  // "DS4N" as little-endian bytes
constexpr uint16_t NCCL_PROTOCOL_VERSION = 1;
constexpr size_t NCCL_HEADER_BYTES = 64;
constexpr uint8_t NCCL_DTYPE_F32 = 1, NCCL_DTYPE_I32 = 2;

struct nccl_header {
    uint16_t version = NCCL_PROTOCOL_VERSION;
    uint16_t flags = 0;
    uint64_t placement_version = 0;
    uint64_t sequence = 0;
    uint32_t layer = 0;
    uint32_t rows = 0;
    uint32_t k = 0;
    uint32_t dim = 0;
    uint32_t executor = 0;
    uint8_t tp_rank = 0;
    uint8_t tp = 0;
};

void encode_nccl_header(const nccl_header &h, uint8_t out[NCCL_HEADER_BYTES]);
Result<nccl_header> decode_nccl_header(const uint8_t *p, size_t n);

// Elements of each payload part (4 bytes each).
inline uint64_t nccl_x_elems(const nccl_header &h) { return uint64_t(h.rows) * h.dim; }
inline uint64_t nccl_route_elems(const nccl_header &h) { return uint64_t(h.rows) * h.k; }
inline uint64_t nccl_reply_elems(const nccl_header &h) { return uint64_t(h.rows) * h.dim + 1; }

// The worker's status word. Values are the protocol's; never renumber.
enum class nccl_reply : int32_t {
    OK = 0,
    STALE_PLACEMENT = 1,  // the header's placement version is not the worker's
    LAYER_NOT_HELD = 2,   // the worker holds no slice of the header's layer
    BAD_HEADER = 3,       // decodes, but another dim, TP rank or executor than the worker's
    EXPERTS_FAILED = 4,   // the worker's expert arithmetic failed (its log says why)
};
// "stale placement version" etc.; "unknown status 17" for a value this build does not know.
std::string nccl_reply_reason(int32_t status);

}  // namespace ds41rt::dist
