#include "engine/attention_row.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/ops.h"
#include "core/dtype.h"

namespace ds41rt::engine {

namespace {

constexpr int64_t ATTN_BLOCK = 64;  // the reference kernel's index block
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

void attend_fp32(const float *q, const std::vector<const float *> &keys, float sink, float scale, int64_t hd,
                 attn_scratch &sc, float *out) {
    const size_t n = keys.size();
    sc.scores.resize(n);
    float mx = sink;
    for (size_t i = 0; i < n; i++) {
        sc.scores[i] = keys[i] ? backend::cpu::dot(q, keys[i], hd) * scale : NEG_INF;
        mx = std::max(mx, sc.scores[i]);
    }
    float den = std::exp(sink - mx);
    for (size_t i = 0; i < n; i++) den += (sc.scores[i] = keys[i] ? std::exp(sc.scores[i] - mx) : 0.0f);
    sc.acc.assign(size_t(hd), 0.0);
    for (size_t i = 0; i < n; i++) {
        if (!keys[i]) continue;
        const float p = sc.scores[i] / den;
        for (int64_t d = 0; d < hd; d++) sc.acc[size_t(d)] += double(p) * keys[i][d];
    }
    for (int64_t d = 0; d < hd; d++) out[d] = float(sc.acc[size_t(d)]);
}

void attend_official(const float *q, const std::vector<const float *> &keys, float sink, float scale, int64_t hd,
                     attn_scratch &sc, float *out) {
    const int64_t n = int64_t(keys.size());
    sc.scores.resize(keys.size());
    sc.acc.assign(size_t(hd), 0.0);
    float mx = NEG_INF, den = 0;
    for (int64_t b0 = 0; b0 < n; b0 += ATTN_BLOCK) {
        const int64_t b1 = std::min(n, b0 + ATTN_BLOCK);
        float bmx = mx;
        for (int64_t i = b0; i < b1; i++) {
            if (!keys[size_t(i)]) continue;
            sc.scores[size_t(i)] = backend::cpu::dot(q, keys[size_t(i)], hd) * scale;
            bmx = std::max(bmx, sc.scores[size_t(i)]);
        }
        if (bmx == NEG_INF) continue;  // nothing valid yet
        const float rescale = std::exp(mx - bmx);
        float bsum = 0;
        for (int64_t i = b0; i < b1; i++)
            if (keys[size_t(i)]) bsum += (sc.scores[size_t(i)] = std::exp(sc.scores[size_t(i)] - bmx));
        den = den * rescale + bsum;
        for (int64_t d = 0; d < hd; d++) sc.acc[size_t(d)] *= rescale;
        for (int64_t i = b0; i < b1; i++) {
            if (!keys[size_t(i)]) continue;
            const float p = round_bf16(sc.scores[size_t(i)]);
            for (int64_t d = 0; d < hd; d++) sc.acc[size_t(d)] += double(p) * keys[size_t(i)][d];
        }
        mx = bmx;
    }
    den += std::exp(sink - mx);
    for (int64_t d = 0; d < hd; d++) out[d] = round_bf16(float(sc.acc[size_t(d)]) / den);
}

}  // namespace

void attend_row(const float *q, const std::vector<const float *> &keys, float sink, float scale, int64_t hd,
                bool official, attn_scratch &scratch, float *out) {
    if (official)
        attend_official(q, keys, sink, scale, hd, scratch, out);
    else
        attend_fp32(q, keys, sink, scale, hd, scratch, out);
}

}  // namespace ds41rt::engine
