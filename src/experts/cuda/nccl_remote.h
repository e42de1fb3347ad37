// The coordinator's side of the NCCL transport (dist/nccl_wire.h): remote expert layers whose
// workers are GPU workers reached GPU to GPU, with the rows, routes and partials staying in
// device memory and every transfer ordered on the caller's CUDA stream, so a decode step's
// remote layers can be part of its captured CUDA graphs (issue 5).
//
// A step's exchanges, in order:
//  - prepare(rows), host, outside any capture: every NCCL layer's links up (a missing or dead one
//    is bootstrapped: TCP connect, HELLO, NCCL_BOOTSTRAP, communicator init) and the answer
//    buffers sized. generation() changes whenever a link is made anew or a buffer moves: graphs
//    captured at another generation hold dead communicators or stale addresses. It starts a step:
//    layers staged by a step that failed before its synchronisation are forgotten.
//  - stage(layer), host, for every remote layer of every step, replayed or not: the layer's next
//    headers (a new sequence number) go into its pinned header slots and its pinned status words
//    are set to "not yet"; the layer joins the exchanges in flight.
//  - enqueue(layer), stream side (capturable): forked from the caller's stream (an event) onto
//    this object's side stream, so the caller's next kernels (the shared expert) run meanwhile.
//    There, in one ncclGroupStart/End per phase over the ranks' communicators: the headers
//    (copied up from the pinned slots when the copy runs, so a replayed graph sends the headers
//    staged for that step), x [rows, dim] f32, ids [rows, K] i32 and weights [rows, K] f32 out;
//    the partials [rows, dim] f32 plus the status words back; backend/cuda/partial_reduce adds
//    the partials in FP32 in rank order into acc; the status words go down to the pinned slots.
//  - join(stream) (capturable): the caller's later work waits for the last enqueued exchange.
//  - the host waits, bounded: wait() for the layers in flight (eager use), or, when the stream
//    also holds other work (a replayed step), a synchronisation that calls waiting() while the
//    stream is busy and drained() once it is idle (engine/cuda device_model's sync watch).
//    waiting() watches each link's async error, each worker's control channel (a dead worker
//    closes it) and progress: a layer counts as answered when its status words have come down;
//    timeout_ms without a layer answering is a timeout. drained() checks the status words.
//    A failure is UNAVAILABLE naming the layer, the worker and the reason; every link of the
//    layers in flight is aborted (which ends their device kernels, so the stream drains) and its
//    control channel closed; the next prepare() re-bootstraps, as the TCP path reconnects.
//
// Ownership: the caller's device buffers (x, ids, weights, acc) must stay valid until the
// exchange has run. Threads: one thread (the engine's); the device is the one current at
// construction.
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

    Status prepare(int64_t rows);
    uint64_t generation() const { return generation_; }
    // nm: the numerics the workers reproduce (official, weight_after_w2; as the TCP request's flags).
    Status stage(int layer, const backend::cpu::expert_numerics &nm, int64_t rows, int k);
    Status enqueue(int layer, const float *x, const int32_t *ids, const float *weights, int64_t rows, int k, float *acc,
                   cudaStream_t stream);
    Status join(cudaStream_t stream);
    // Eager use: waits for every layer in flight, then drained(); joins the last enqueue's stream.
    Status wait();
    Status waiting();
    Status drained();
    // Host, during a replayed step: returns once at most `behind` staged layers are unanswered
    // (watching as waiting() does). The host then issues at most that many layers ahead of the
    // exchanges, so what it queues behind a stalled worker stays small: a host call that blocks
    // on a full launch queue or copy staging, behind an exchange that never ends, would never
    // reach the watch.
    Status keep_up(size_t behind);

    // The three calls above for one layer alone (prepare, stage, enqueue, join, wait): the round
    // trip bench-remote times and the tests drive without an engine.
    Status run(int layer, const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids,
               const float *weights, int64_t rows, int k, float *acc, cudaStream_t stream);

private:
    struct peer;
    struct slot;
    Status ensure_linked(int w, dist::deadline d);
    // Ends every exchange in flight: aborts their links, closes their control channels; names
    // `layer` and its TP rank `rank_index` (-1: every rank of the layer) in the UNAVAILABLE.
    Status failed(int layer, int rank_index, const Status &st);
    bool answered(const slot &s) const;

    remote_layout layout_;
    int64_t dim_;
    int device_;
    std::vector<std::unique_ptr<peer>> peers_;
    std::vector<std::unique_ptr<slot>> slots_;  // by layer (made by the first stage())
    std::vector<int> in_flight_;                // staged layers, in order
    size_t answered_ = 0;                       // in_flight_[0, answered_) have answered
    dist::clock::time_point progress_{};        // the last answer (or the first stage)
    uint64_t next_seq_ = 1, generation_ = 0;
    int64_t capacity_rows_ = 0;                 // the answer buffers' size
    uint32_t spins_ = 0;
    cudaEvent_t fork_ = nullptr, join_ = nullptr;
    cudaStream_t side_ = nullptr;    // where the exchanges run
    cudaStream_t caller_ = nullptr;  // the stream of the last enqueue (wait() joins it)
};

}  // namespace ds41rt::experts
