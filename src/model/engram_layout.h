// The Engram table layout (V4.1 spec 4.9 item 6): one prime-sized bucket range per (engram
// layer, n-gram size, head). Primes are drawn in (layer, n, head) order, each the next prime
// above the previous pick of the same n-gram run (the run restarting at engram_vocab_size for
// every n), never reusing one. A layer's table has as many rows as its primes sum to.
#pragma once

#include <cstdint>
#include <vector>

namespace ds41rt::model {

// primes[(layer * (max_ngram - 1) + n) * n_heads + head] for n = 0 .. max_ngram - 2 (2-grams
// first). vocab: engram_vocab_size, where the search starts.
std::vector<int64_t> engram_primes(int64_t vocab, int n_layers, int max_ngram, int n_heads);

// Row count of each layer's table: the sum of its primes.
std::vector<int64_t> engram_prime_sums(int64_t vocab, int n_layers, int max_ngram, int n_heads);

}  // namespace ds41rt::model
