// The planner's charging rules: how many bytes each owner of memory needs besides weights.
//
// Every function is a formula over the model shapes and the load targets (context, concurrency,
// prefill batch, drafted tokens), so a plan can be re-derived by hand; charges.cpp states each
// term and where its constants come from. What is sized here:
//  - sequence state (the KV pools), in the packed cache formats of the model specs;
//  - the step workspace (activations of the largest step), logits, transport staging buffers;
//  - CUDA-graph memory (one executable graph per captured row bucket);
//  - request-time memory (sampler and grammar scratch, the state snapshot of one request);
//  - the CUDA runtime (context and lazily loaded module images);
//  - headroom, derived from the dynamic charges and the concurrency (never a fixed constant: a
//    fixed 2 GiB was the reference system's worst production failure, reference-system 6.1).
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "dist/expert_bytes.h"
#include "model/config.h"

namespace ds41rt::dist {

// What the deployment must serve at once.
struct load_targets {
    int64_t context = 131072;  // tokens per sequence the KV pool must hold
    int concurrency = 16;      // sequences decoding at once
    int prefill_batch = 2048;  // most prompt tokens of one step
    int draft_tokens = 0;      // drafted tokens verified per sequence and step (0: no drafter)
};

// Sequences are paged in 512-token groups (the reference's page group of 455,680 B for V4.1,
// reference-system 3 "Memory budgeting"): the pool holds whole groups.
constexpr int64_t KV_PAGE_TOKENS = 512;
int64_t kv_tokens(int64_t context);

// Per-sequence state of one target layer, in bytes, for a sequence of `tokens` tokens.
struct layer_state {
    uint64_t window = 0;      // sliding-window ring
    uint64_t compressed = 0;  // compressed KV entries (on the layers that own them)
    uint64_t index_keys = 0;  // indexer keys (on the layers that own them)
    uint64_t carry = 0;       // compressor state between calls (fp32)
};
layer_state layer_state_bytes(const model::model_config &c, int layer, int64_t tokens);
// The drafter's (MTP / DSpark) window rings of one sequence.
uint64_t drafter_state_bytes(const model::model_config &c);

// Rows of the largest step: a prefill chunk or every sequence's decode row plus its drafts.
int64_t step_rows(const load_targets &t);
// Rows that need a full logit row (sampled decode rows and verified drafts).
int64_t logit_rows(const load_targets &t);

// Activations of one step of `rows` rows through the layers of one coordinator GPU.
uint64_t coordinator_workspace_bytes(const model::model_config &c, const load_targets &t);
// FP32 logits of logit_rows() rows (on the GPU that holds the head).
uint64_t logits_bytes(const model::model_config &c, const load_targets &t);
// Send and receive staging of one remote layer's exchange with `tp` ranks, double-buffered.
uint64_t coordinator_transport_bytes(const model::model_config &c, expert_format f, const load_targets &t, int tp);
// Executable CUDA graphs for the captured row buckets, scaled by the share of the step's
// layers the owner runs (layer_share in [0, 1]).
uint64_t graph_bytes(const load_targets &t, double layer_share);
// Scratch of the active requests: sampler and grammar buffers and one snapshot of a request's
// window state (prefix reuse, speculative rollback).
uint64_t request_bytes(const model::model_config &c, const load_targets &t);

// A worker holding a slice `width` channels wide: activations of one remote-layer request of
// step_rows() rows, and its double-buffered frames.
uint64_t worker_workspace_bytes(const model::model_config &c, const load_targets &t, int64_t width);
uint64_t worker_transport_bytes(const model::model_config &c, expert_format f, const load_targets &t);

// CUDA context and module images of one process on one GPU.
uint64_t runtime_bytes();

// Headroom: an eighth of the dynamically allocated charges (allocator rounding and
// fragmentation grow with them) plus 64 MiB per concurrent sequence (per-request transients the
// charges above do not list: stream-ordered copies, lazily created events and handles).
uint64_t headroom_bytes(uint64_t dynamic_bytes, const load_targets &t);

}  // namespace ds41rt::dist
