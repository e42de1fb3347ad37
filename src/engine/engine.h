// The engine: one loaded model and the sequences it is running.
//
// What crosses this boundary: token ids in, logits out, and opaque sequence handles. Callers
// (serving, tools, tests) never see weights, caches or kernels. Each sequence owns its state
// (window KV rings, compressor buffers and compressed entries, indexer keys, Engram history),
// created by create_sequence() and released by free_sequence().
//
// A step takes several sequences at once, each with one or more new tokens appended at its
// current length: a prefill chunk is many tokens, a decode step one. The result for each
// sequence is the logits of every token it was given, in order.
//
// Threading: one thread drives an engine at a time; ops parallelize internally.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/sampling_math.h"
#include "core/status.h"
#include "core/tensor.h"
#include "experts/routed_experts.h"
#include "model/config.h"

namespace ds41rt::engine {

// Which numerics the forward pass reproduces.
//  - TRANSFORMERS: what the transformers implementation computes in fp32: fp32 activations, no
//    activation quantization before matmuls; V4.1 simulates its three cache quantizations (FP8
//    window KV, FP4 compressed entries, FP4 indexer q/k) where the dims are whole blocks.
//  - OFFICIAL: DeepSeek's inference code: bf16 rounding points, per-block FP8 activation
//    quantization before every FP8/FP4 matmul, the same cache quantizations.
enum class numerics { TRANSFORMERS, OFFICIAL };

// Where the forward pass runs: the CPU reference, or the CUDA backend (V4.1 and V4; needs
// a build with CUDA and a GPU).
enum class backend_kind { CPU, CUDA };

struct engine_options {
    numerics mode = numerics::TRANSFORMERS;
    backend_kind backend = backend_kind::CPU;
    // Time each section of the forward pass (GPU: device events around it; a benchmark's table).
    bool profile = false;
    // Which layers' routed experts run on expert workers (empty: all local).
    experts::remote_layout remote;
};

using seq_id = int64_t;

// One section of the forward pass as profiled: total milliseconds over `calls` entries. A
// weight product's entry (product_times) also counts the bytes it must move (its weights once,
// its input and output rows) and its FLOPs (2 M N K), so a report can set its time against the
// device's copy bandwidth and matrix rate; sections leave them 0.
struct op_time {
    std::string name;
    double ms = 0;
    int64_t calls = 0;
    double bytes = 0, flops = 0;
};

// Which of an input's rows step() returns logits for: every token's ([n, vocab]), the last
// token's only ([1, vocab]: what sampling needs), or none ([0, vocab]: a prompt chunk that does
// not end the prompt). SAMPLE: the last token's row, sampled by the engine as step_input::sample
// says (step_sampled); plain step() returns it as LAST. The engines run the head over those rows only.
enum class logit_rows : uint8_t { ALL, LAST, NONE, SAMPLE };

// How the engine samples a SAMPLE row: the serving sampler's request in the form the row
// arithmetic takes (backend/cpu/sampling_math.h; serving/sampling.h has the client semantics).
struct sample_spec {
    backend::cpu::row_sampling p;
    uint64_t seed = 0;
    int64_t position = 0;                         // of the token in the output (the draw's key)
    std::vector<backend::cpu::token_count> counts;  // the tokens generated so far (penalties)
    std::vector<uint32_t> allowed;                // a grammar's token bitmask; empty: no mask
    bool logprobs = false;                        // report the raw logprob of the pick
    int32_t top_logprobs = 0;                     // and the k most likely raw tokens (0..20)
};

// A sampled row: the token, and when asked its raw logprob and the top_logprobs best.
struct sample_result {
    int32_t token = -1;
    float logprob = 0.0f;
    std::vector<backend::cpu::id_logprob> top;
};

// A step_input token standing for the pick its sequence's last SAMPLE row drew in an issued step
// (engine::issue_sampled), which may not have reached the host yet.
inline constexpr int32_t PREVIOUS_PICK = -2;

struct step_input {
    seq_id seq = -1;
    std::vector<int32_t> tokens;  // appended at the sequence's current length
    logit_rows logits = logit_rows::ALL;
    sample_spec sample = {};      // logit_rows::SAMPLE only
};

// The number of logits rows step() returns for in.
inline int64_t logits_rows_of(const step_input &in) {
    return in.logits == logit_rows::ALL ? int64_t(in.tokens.size()) : in.logits == logit_rows::NONE ? 0 : 1;
}

// One logits row sampled on the host (backend/cpu/sampling_math.h): what step_sampled does for
// engines without a device sampler, and what the device sampler must pick.
sample_result sample_on_host(std::span<const float> row, const sample_spec &spec);

class engine {
public:
    virtual ~engine() = default;

    // Loads config.json and the checkpoint in dir (any supported storage format).
    static Result<std::unique_ptr<engine>> open(const std::string &dir, const engine_options &opt = {});

    // Full-size random weights of c's shapes in the official storage formats, filled on the GPU
    // (`--load-format dummy`), the first `layers` layers only (-1: all). CUDA backend, V4.1 or V4.
    static Result<std::unique_ptr<engine>> open_dummy(const model::model_config &c, int layers, uint64_t seed,
                                                      const engine_options &opt);

    virtual const model::model_config &config() const = 0;

    virtual seq_id create_sequence() = 0;
    virtual void free_sequence(seq_id s) = 0;
    virtual int64_t sequence_length(seq_id s) const = 0;

    // Runs one batched step. logits[i] is [inputs[i].tokens.size(), vocab] fp32. When it fails
    // after starting (UNAVAILABLE: a remote expert layer did not answer), the sequences of the
    // step are left part-way through and must be freed.
    virtual Status step(const std::vector<step_input> &inputs, std::vector<Tensor> *logits) = 0;

    // step(), where each SAMPLE input's last row is sampled as its sample_spec says:
    // (*sampled)[i] holds the pick of a SAMPLE input (token -1 for the others), and its logits[i]
    // is [0, vocab]. The GPU engines sample on the device when every row they return is a SAMPLE
    // row (what serving asks for), so the logits never reach the host; otherwise (and on the CPU)
    // the rows come back and sample_on_host picks, with the same result.
    virtual Status step_sampled(const std::vector<step_input> &inputs, std::vector<Tensor> *logits,
                                std::vector<sample_result> *sampled);

    // Decode steps issued ahead, as an asynchronous scheduler runs them: issue_sampled() is
    // step_sampled() for inputs that may hold PREVIOUS_PICK tokens, and returns once the step is
    // issued; collect_sampled() waits for the picks of the oldest issued step not yet collected
    // ((*sampled)[i] as step_sampled gives them). A caller that issues step N + 1 before it collects
    // step N keeps the device busy while the host handles step N's picks and prepares the next
    // inputs. This base runs each step whole in issue_sampled, PREVIOUS_PICK taken from the picks
    // it kept; an engine with a device sampler may leave the step running and read those picks on
    // the device. INVALID_ARGUMENT: a PREVIOUS_PICK whose sequence has no pick, or a collect
    // with nothing issued. A failed issue leaves nothing issued; its sequences are as after a
    // failed step().
    virtual Status issue_sampled(const std::vector<step_input> &inputs);
    virtual Status collect_sampled(std::vector<sample_result> *sampled);

    // Section times since the last reset, when profiling (engine_options::profile, or
    // set_profile). The GPU engines also report "host.issue": the host's wall time from a step's
    // start to its last launch, profiling or not (a step whose host.issue is its whole time is
    // bound by the launches, not by the device).
    virtual std::vector<op_time> op_times() const { return {}; }
    // The GPU engines, when profiling: every weight product's device time (all it launches: a
    // GEMV, a GEMM with its pre-passes, a layer's routed experts), summed by its label (the
    // weights' roles, the kernel family, the rows), with its bytes and FLOPs. Reset and switched
    // with the sections.
    virtual std::vector<op_time> product_times() const { return {}; }
    virtual void reset_op_times() {}
    virtual void set_profile(bool) {}
    // GPU engines: replay decode steps' fixed-shape pieces from CUDA graphs (the default) or
    // launch every kernel eagerly.
    virtual void set_cuda_graphs(bool) {}

protected:
    // free_sequence's part for the issued steps: the sequence's kept pick goes.
    void forget_pick(seq_id s) { last_pick_.erase(s); }

private:
    std::map<seq_id, int32_t> last_pick_;            // each sequence's last pick (issue_sampled)
    std::deque<std::vector<sample_result>> issued_;  // picks of the issued steps, oldest first
};

}  // namespace ds41rt::engine
