// The coordinator's side of the NCCL transport (dist/nccl_wire.h): remote expert layers whose
// workers are GPU workers reached GPU to GPU, with the rows, routes and partials staying in
// device memory and every transfer ordered on the caller's CUDA stream.
//
// enqueue() puts one layer's exchange behind the caller's stream: forked from it (an event) onto
// this object's own stream, so the caller's next kernels (the engine's shared expert) run while
// the ranks work, and joined back to it by wait(); a fork / join that CUDA graph capture keeps.
// On the side stream: for every TP rank, in one ncclGroupStart/
// End over the ranks' communicators, the 64-byte header, x [rows, dim] f32, ids [rows, K] i32
// and weights [rows, K] f32 go out and the partial [rows, dim] f32 plus the status word come
// back; then backend/cuda/partial_reduce adds the partials in FP32 in rank order into acc and
// the status words are copied to pinned host memory. wait() is the host side: it polls the
// layer's completion event against the layout's timeout, watching each communicator's async
// error and each worker's control channel (a dead worker closes it). A failure is UNAVAILABLE
// naming the layer, the worker and the reason; the layer's communicators are aborted and their
// control channels closed, and the next request re-bootstraps them (TCP connect, HELLO,
// NCCL_BOOTSTRAP, communicator init), as the TCP path reconnects.
//
// Ownership: the caller's device buffers (x, ids, weights, acc) must stay valid until wait()
// returns. Threads: one thread (the engine's), one layer in flight at a time; the device is the
// one current at construction.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "core/status.h"
#include "dist/tcp_transport.h"
#include "experts/routed_experts.h"

namespace ds41rt::experts {

class nccl_remote {
public:
    nccl_remote(remote_layout layout, int64_t dim, int device);
    ~nccl_remote();
    nccl_remote(const nccl_remote &) = delete;
    nccl_remote &operator=(const nccl_remote &) = delete;

    // nm: the numerics the workers reproduce (official, weight_after_w2; as the TCP request's flags).
    Status enqueue(int layer, const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids, const float *weights, int64_t rows,
                   int k, float *acc, cudaStream_t stream);
    Status wait();

private:
    struct peer;
    Status ensure_linked(int w, dist::deadline d);
    // Ends the layer in flight: aborts its links, closes their control channels, drains the
    // stream; rank_index -1 names every rank of the layer.
    Status failed(int rank_index, const Status &st);

    remote_layout layout_;
    int64_t dim_;
    int device_;
    std::vector<std::unique_ptr<peer>> peers_;
    uint64_t next_seq_ = 1;
    int layer_ = -1;  // in flight
    int64_t rows_ = 0;
    dist::deadline d_{};
    bool recorded_ = false;  // done_ marks the layer in flight
    cudaEvent_t done_ = nullptr, fork_ = nullptr;
    cudaStream_t side_ = nullptr;    // where the exchanges run
    cudaStream_t caller_ = nullptr;  // the stream of the layer in flight (joined by wait())
};

}  // namespace ds41rt::experts
