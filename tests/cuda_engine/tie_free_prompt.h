// The prompt of the whole-model GPU tests on the tiny synthesized V4.1 models (gpu_exl3_test,
// gpu_worker_test): chosen so that ~1e-6 differences in an engine's sums do not flip a routing
// or indexer decision.
#pragma once

#include <cstdint>
#include <vector>

namespace ds41rt {

// The prompt of the whole-model tests. A tiny random model is close to a tie somewhere: its
// router picks 2 of 8 experts per token and layer, its indexer 4 keys, and a pick within fp32
// noise of the next candidate flips between engines whose sums differ by ~1e-6, moving the
// logits by O(1) from there on. The first prompt used ((i * 97 + 261) % 512) had a router margin
// of 5.4e-5 (second vs third biased score) at prompt row 46 of the dim 128 / moe_inter 384
// model; the GPU engine diverged there (logits 0.46 apart, greedy 7/13), and so did the CPU
// engine alone with its gate logits perturbed by 1e-5 relative (greedy 7/13 again): the model's
// conditioning, not the GPU engine. This prompt (Python random.Random(2), 48 x randrange(3, 510))
// is one of three among 40 whose TRANSFORMERS continuation on the CPU engine stays the same, for
// the EXL3 model and for the official model, when the gate logits are perturbed by +-1e-5,
// +-1e-4 and 3e-4 relative (a debug hook in engine/v41_steps route(), not kept); its smallest
// router margin on the official model is 5.8e-4 and its indexer top-k margin 1e-3.
// OFFICIAL numerics have no such prompt: every bf16 / FP8 rounding point turns a 1e-7 difference
// into a 0.4% one now and then (a 1e-5 gate perturbation changes the CPU's own OFFICIAL
// continuation at its third token), so OFFICIAL is reported, not asserted, as gpu_vs_cpu_test
// does for the QAT fixtures, apart from finite logits. With this prompt the official model's
// OFFICIAL prefill logits match the CPU's to 5e-8 up to position 44 and are 0.11 apart from 45 on
// (H200, 2026-11-30; the EXL3 model's 0.97 somewhere, positions not printed); the old prompt
// matched at every position. Bisected: not the indexer's device selections (the host's top-k
// gives the same), not the batch shape (the same when the prompt is fed in chunks cut at 16 / 32
// / 40 / 44 / 45 / 46; the CPU bit-identical across chunkings), present with the first 5 layers
// (0.0085 at 45, growing with depth). It is what OFFICIAL does to a one-ulp difference: the CPU
// engine alone, with one fp32 ulp added to or taken from 1% of its linear outputs before their
// bf16 rounding (a debug hook, not kept), moves its own prefill logits by 0.007-0.2 at 36 of the
// old prompt's 48 positions (with 10% of them nudged: 0.03-0.8 from position 8 of this one); the GPU's fp32 sums differ from the
// host's in order (GEMV K slices), so now and then one lands on the other side of a bf16 rounding.
inline const std::vector<int32_t> TIE_FREE_PROMPT = {492, 444, 488, 437, 31,  49,  46,  187, 430, 89,  379, 417, 345, 440, 160, 131,
                                     313, 111, 313, 21,  300, 351, 84,  223, 329, 204, 414, 373, 443, 263, 489, 193,
                                     281, 482, 230, 260, 140, 464, 21,  448, 17,  189, 241, 480, 166, 467, 197, 219};

}  // namespace ds41rt
