// An expert worker's TP slices on a GPU: the routed experts of its layers in MXFP4, NVFP4 or EXL3
// as the checkpoint stores them (each rank's rows of w1 / w3 and columns of w2, cut in the stored form),
// run through the MoE decode kernels for each request: backend/cuda/moe_decode from host routes,
// or backend/cuda/moe_routed from routes already on the GPU (the NCCL worker); EXL3 layers
// through backend/cuda/exl3_moe from host routes and backend/cuda/exl3_routed from device routes.
//
// What crosses this boundary: slices in at load; per request host rows and routes in, the FP32
// partial rows out, with the rounding points of backend/cpu routed_expert_sum, so a GPU worker
// answers what a CPU worker answers up to fp32 summation order.
//
// Threads: one request at a time (the worker serialises its arithmetic).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <map>
#include <memory>
#include <vector>

#include "backend/cpu/dummy_values.h"
#include "backend/cpu/routed.h"
#include "backend/cpu/swiglu.h"
#include "core/status.h"
#include "model/expert_slice.h"

namespace ds41rt::dist {

class gpu_experts {
public:
    static Result<std::unique_ptr<gpu_experts>> make(int device);
    ~gpu_experts();
    gpu_experts(const gpu_experts &) = delete;
    gpu_experts &operator=(const gpu_experts &) = delete;

    // One layer's slices, by expert id: {w1, w2, w3} each, w1 / w3 [I, D], w2 [D, I].
    Status add_layer(int layer, int64_t D, float swiglu_limit, std::vector<std::array<model::mxfp4_slice, 3>> experts);
    // The same for NVFP4 slices (W4A4, the bytes as published, backend/cuda moe_decode's NVFP4
    // mode): w1 and w3 must share their scalars (the checkpoint's check), and every slice's input
    // width must be whole 32 channels (the W4A4 GEMV's K; V4.1's 2304 gives 1152 / 768 / 576 / 384
    // at TP 2 / 3 / 4 / 6): otherwise INVALID_ARGUMENT at load, not at the first request.
    Status add_nvfp4_layer(int layer, int64_t D, float swiglu_limit, std::vector<std::array<model::nvfp4_slice, 3>> experts);
    // The same for EXL3 slices (trellis tiles with their suh / svh, 128-channel cuts): host routes
    // through backend/cuda exl3_moe, device routes (run_routed) through backend/cuda exl3_routed;
    // the trellis is decoded in the GEMV either way.
    Status add_exl3_layer(int layer, int64_t D, float swiglu_limit, std::vector<std::array<model::exl3_slice, 3>> experts);
    // The same from dummy weights (`--load-format dummy`): per expert the {w1, w2, w3} windows
    // (this rank's rows of w1 / w3, columns of w2) of the coordinator's dummy plan, filled here on
    // the GPU from (seed, tensor id) so they hold exactly those ranges of the whole tensors.
    Status add_dummy_layer(int layer, int64_t D, int64_t I, float swiglu_limit,
                           const std::vector<std::array<backend::cpu::dummy_tensor_desc, 3>> &windows, uint64_t seed);
    // The same for NVFP4 windows (E2M1 codes and the E4M3 scale plane as published; the two
    // scalars of each window from its encoding, backend/cpu dummy_encoding_for), run as
    // add_nvfp4_layer's slices, with its checks.
    Status add_dummy_nvfp4_layer(int layer, int64_t D, float swiglu_limit,
                                 const std::vector<std::array<backend::cpu::dummy_tensor_desc, 3>> &windows, uint64_t seed);
    // The same for EXL3 windows (trellis, then suh and svh in the scale buffer, as the dummy fill
    // lays them out), run as add_exl3_layer's slices; cb: the codebook the config announces.
    Status add_dummy_exl3_layer(int layer, int64_t D, float swiglu_limit,
                                const std::vector<std::array<backend::cpu::dummy_tensor_desc, 3>> &windows,
                                uint64_t seed, model::exl3_codebook cb);
    // partial[rows, D] = this slice's routed-expert sum of hidden[rows, D]. NOT_FOUND for a layer
    // not held.
    Status run(int layer, const backend::cpu::expert_numerics &nm, const float *hidden, int64_t rows,
               const backend::cpu::route_table &rt, float *partial);
    // The same with hidden and partial on this GPU (the NCCL worker's buffers); returns once the
    // partial is written.
    Status run_device(int layer, const backend::cpu::expert_numerics &nm, const float *hidden_dev, int64_t rows,
                      const backend::cpu::route_table &rt, float *partial_dev);
    // The same from routes on this GPU (ids [rows, K] int32, -1 = no route, weights [rows, K]
    // fp32: the router's outputs as the NCCL worker receives them), stream-ordered after and
    // before `stream`'s work, with no host synchronisation (backend/cuda moe_routed, whose output
    // is bit-identical to run_device's for the same routes; EXL3: exl3_routed, equal to run_device's
    // up to fp32 summation order). A route naming an expert this slice
    // lacks (or an expert repeated past the kernels' limit) sets *status_word (device memory) to
    // fail_value; routed_errors() names it afterwards.
    Status run_routed(int layer, const backend::cpu::expert_numerics &nm, const float *x_dev, const int32_t *ids_dev,
                      const float *weights_dev, int64_t rows, int k, float *partial_dev, int32_t *status_word,
                      int32_t fail_value, cudaStream_t stream);
    // What run_routed flagged since the last call, named (and cleared); synchronises.
    Status routed_errors();
    bool has_layer(int layer) const;
    int device() const;
    size_t device_bytes() const { return bytes_; }

private:
    struct impl;
    gpu_experts() = default;
    // bytes of host memory copied to a device block this object owns (counted in device_bytes).
    Result<const uint8_t *> upload(const void *host, size_t bytes);
    // A dummy window filled on the GPU into two blocks this object owns (values, scales).
    Status fill_window(const backend::cpu::dummy_tensor_desc &d, uint64_t seed, const uint8_t **w, const uint8_t **scale);
    // An expert's three slices (MXFP4 or NVFP4) uploaded: dev = {w1 codes, w1 scales, w2 codes,
    // w2 scales, w3 codes, w3 scales}.
    template <class Slice>
    Status upload_slices(const std::array<Slice, 3> &e, const uint8_t *(&dev)[6]);
    std::unique_ptr<impl> p_;
    size_t bytes_ = 0;
};

}  // namespace ds41rt::dist
