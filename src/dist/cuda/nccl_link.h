// One 2-rank NCCL communicator between the coordinator (rank 0) and one GPU worker (rank 1),
// non-blocking (ncclConfig blocking = 0), so no NCCL call can hang its caller: every call
// returns at once and settle() waits for its completion with a deadline, polling
// ncclCommGetAsyncError and a caller's cancel test (a hung-up control channel, a stop flag).
// A failed or timed-out link is aborted (ncclCommAbort, which also ends the device kernels
// waiting on it, run on a thread of its own: see abort()) and thrown away; the owner bootstraps a
// new one.
//
// NCCL_NVLS_ENABLE is set to 0 before the first communicator unless the environment says
// otherwise: the transport never uses NVLink SHARP / multicast objects.
//
// Threads: one thread drives a link at a time.
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "dist/nccl_wire.h"
#include "dist/tcp_transport.h"

namespace ds41rt::dist {

// An NCCL result as a Status (UNAVAILABLE for remote and system errors, INTERNAL otherwise),
// naming the call and NCCL's last error text.
Status nccl_status(ncclResult_t r, const char *what, ncclComm_t comm = nullptr);

Result<nccl_id> nccl_new_id();

class nccl_link {
public:
    // Starts joining the communicator of `id` as `rank` on `device` (current for the call).
    // The link is usable once settle() returns OK.
    static Result<std::unique_ptr<nccl_link>> start(const nccl_id &id, int rank, int device, std::string peer);
    ~nccl_link();  // aborts the communicator (safe in every state)
    nccl_link(const nccl_link &) = delete;
    nccl_link &operator=(const nccl_link &) = delete;

    // Waits until the communicator's pending host-side work (init, a group's enqueue) is done.
    // UNAVAILABLE naming `what` and the peer when d passes, cancel() says so, or NCCL reports an
    // error; the link is then aborted.
    Status settle(deadline d, const std::function<bool()> &cancel, const char *what);
    // OK while healthy (in progress counts as healthy); otherwise the error, and aborts.
    Status check(const char *what);
    // Returns at once: the device kernels on the link end shortly after (wait on the stream),
    // the resources are freed once the peer has aborted too.
    void abort();
    // What the communicator's queued work touches (the caller's stream, event and buffers): an
    // abort holds it until ncclCommAbort has returned, so the owner never frees it under the
    // reclaim. (The worker freed its stream and buffers right after a detached abort, and the
    // reclaim, resumed after a SIGSTOP, died of SIGSEGV in cuStreamWaitEvent: H200 x2, session 7.)
    void hold_until_aborted(std::shared_ptr<void> r) { held_.push_back(std::move(r)); }

    ncclComm_t comm() const { return comm_; }
    bool alive() const { return comm_ != nullptr; }
    int device() const { return device_; }
    const std::string &peer() const { return peer_; }

private:
    nccl_link() = default;
    ncclComm_t comm_ = nullptr;
    int device_ = 0;
    std::string peer_;
    std::vector<std::shared_ptr<void>> held_;
};

}  // namespace ds41rt::dist
