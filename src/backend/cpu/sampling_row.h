// What the CPU and GPU samplers share at the level of one row, in C++17 so the CUDA sources can
// include it: the counter-based uniform (exact integer arithmetic, identical on both sides) and
// the per-row parameters in the form the arithmetic uses (sampling_math.h says how each rounds).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DS41RT_HOST_DEVICE __host__ __device__
#else
#define DS41RT_HOST_DEVICE
#endif

namespace ds41rt::backend::cpu {

DS41RT_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// The 53 random bits of the draw for (seed, position); the uniform is bits * 2^-53 in [0, 1).
DS41RT_HOST_DEVICE inline uint64_t sampling_uniform_bits(uint64_t seed, int64_t position) {
    return splitmix64(splitmix64(seed) ^ uint64_t(position) * 0xD1B54A32D192ED03ull) >> 11;
}

DS41RT_HOST_DEVICE inline double sampling_uniform(uint64_t seed, int64_t position) {
    return double(sampling_uniform_bits(seed, position)) * 0x1.0p-53;
}

struct row_sampling {
    bool greedy = true;
    float inv_temperature = 1.0f;  // 1.0f / temperature; unused when greedy
    float top_p = 1.0f;            // >= 1: off
    int32_t top_k = 0;             // <= 0: off
    float log_min_p = -__builtin_huge_valf();  // sampling_log_min_p(min_p); -inf: off
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
};

struct token_count {
    int32_t token = 0;  // the tokens generated so far, each once; out-of-range ones are ignored
    int32_t count = 0;
};

}  // namespace ds41rt::backend::cpu
