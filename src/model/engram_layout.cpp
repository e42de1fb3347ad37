#include "model/engram_layout.h"

#include <cstddef>
#include <set>

namespace ds41rt::model {

namespace {

bool is_prime(int64_t n) {
    if (n < 2) return false;
    if (n % 2 == 0) return n == 2;
    for (int64_t d = 3; d * d <= n; d += 2)
        if (n % d == 0) return false;
    return true;
}

}  // namespace

std::vector<int64_t> engram_primes(int64_t vocab, int n_layers, int max_ngram, int n_heads) {
    std::set<int64_t> used;
    std::vector<int64_t> primes;
    for (int l = 0; l < n_layers; l++)
        for (int n = 0; n < max_ngram - 1; n++) {
            int64_t p = vocab - 1;
            for (int h = 0; h < n_heads; h++) {
                do p++;
                while (!is_prime(p) || used.count(p));
                used.insert(p);
                primes.push_back(p);
            }
        }
    return primes;
}

std::vector<int64_t> engram_prime_sums(int64_t vocab, int n_layers, int max_ngram, int n_heads) {
    const std::vector<int64_t> primes = engram_primes(vocab, n_layers, max_ngram, n_heads);
    const size_t per_layer = size_t(max_ngram - 1) * size_t(n_heads);
    std::vector<int64_t> sums(size_t(n_layers), 0);
    for (size_t i = 0; i < primes.size(); i++) sums[i / per_layer] += primes[i];
    return sums;
}

}  // namespace ds41rt::model
