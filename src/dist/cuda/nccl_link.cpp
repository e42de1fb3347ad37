#include "dist/cuda/nccl_link.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>
#include <thread>

namespace ds41rt::dist {

namespace {

void nccl_env() {
    // Multicast objects need fabric-manager state the shared H200 hosts do not give us, and a
    // half-made one outlives the process; never let NCCL try.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
}

}  // namespace

Status nccl_status(ncclResult_t r, const char *what, ncclComm_t comm) {
    if (r == ncclSuccess || r == ncclInProgress) return Status::ok();
    std::string m = std::string(what) + ": " + ncclGetErrorString(r);
    if (const char *last = ncclGetLastError(comm); last && *last) m += " (" + std::string(last) + ")";
    if (r == ncclRemoteError || r == ncclSystemError) return Status::unavailable(m);
    return Status::internal(m);
}

Result<nccl_id> nccl_new_id() {
    nccl_env();
    ncclUniqueId u;
    static_assert(sizeof(u) == NCCL_ID_BYTES);
    DS41RT_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&u), "ncclGetUniqueId"));
    nccl_id id;
    std::memcpy(id.data(), &u, NCCL_ID_BYTES);
    return id;
}

Result<std::unique_ptr<nccl_link>> nccl_link::start(const nccl_id &id, int rank, int device, std::string peer) {
    nccl_env();
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
        return Status::unavailable("nccl: cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(e));
    std::unique_ptr<nccl_link> l(new nccl_link());
    l->device_ = device;
    l->peer_ = std::move(peer);
    ncclUniqueId u;
    std::memcpy(&u, id.data(), NCCL_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&l->comm_, 2, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        Status st = nccl_status(r, "ncclCommInitRankConfig", l->comm_);
        return Status::unavailable("nccl link to " + l->peer_ + ": " + st.message());
    }
    return l;
}

nccl_link::~nccl_link() { abort(); }

void nccl_link::abort() {
    if (!comm_) return;
    // ncclCommAbort first raises the communicator's abort flag (its device kernels return) and
    // then reclaims its resources, which between two processes of one host waits for the peer to
    // abort as well (NVIDIA/nccl#863): with a stopped peer it does not return, and a caller that
    // waited for it hung past every deadline (the H200 fault test, 2026-11-30). The reclaim runs
    // on a thread of its own; the caller goes on at once and only waits, bounded, for its stream
    // to drain. A peer that never comes back leaves that thread and the communicator's memory
    // behind until the process ends, and what hold_until_aborted() was given with them.
    std::thread([c = comm_, dev = device_, peer = peer_, held = std::move(held_)]() mutable {
        cudaSetDevice(dev);
        if (const ncclResult_t r = ncclCommAbort(c); r != ncclSuccess)
            spdlog::warn("nccl: abort of the link to {}: {}", peer, ncclGetErrorString(r));
        held.clear();  // freed here, after the reclaim
    }).detach();
    held_.clear();
    comm_ = nullptr;
}

Status nccl_link::check(const char *what) {
    if (!comm_) return Status::unavailable(std::string(what) + ": the NCCL link to " + peer_ + " is closed");
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r == ncclSuccess) r = async;
    if (r == ncclSuccess || r == ncclInProgress) return Status::ok();
    Status st = nccl_status(r, what, comm_);
    abort();
    return Status::unavailable("NCCL link to " + peer_ + ": " + st.message());
}

Status nccl_link::settle(deadline d, const std::function<bool()> &cancel, const char *what) {
    for (int spin = 0;; spin++) {
        if (!comm_) return Status::unavailable(std::string(what) + ": the NCCL link to " + peer_ + " is closed");
        ncclResult_t async = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
        if (r == ncclSuccess) r = async;
        if (r == ncclSuccess) return Status::ok();
        if (r != ncclInProgress) {
            Status st = nccl_status(r, what, comm_);
            abort();
            return Status::unavailable("NCCL link to " + peer_ + ": " + st.message());
        }
        if (clock::now() >= d) {
            abort();
            return Status::unavailable(std::string(what) + ": the NCCL link to " + peer_ + " timed out");
        }
        if (cancel && cancel()) {
            abort();
            return Status::unavailable(std::string(what) + ": the NCCL link to " + peer_ + " was cancelled (peer gone)");
        }
        if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

}  // namespace ds41rt::dist
