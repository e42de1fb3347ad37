#include "engine/v41_steps.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/threads.h"
#include "engine/topk.h"

namespace ds41rt::engine::v41 {

namespace cpu = backend::cpu;

namespace {
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
}

void compress_pool(const float *kv, const float *gate, int64_t groups, int ratio, int64_t hd, float *latent) {
    for (int64_t g = 0; g < groups; g++)
        for (int64_t ch = 0; ch < hd; ch++) {
            // Softmax over the group's tokens, independently per channel, in fp32.
            float mx = NEG_INF;
            for (int t = 0; t < ratio; t++) mx = std::max(mx, gate[(g * ratio + t) * hd + ch]);
            float den = 0, num = 0;
            for (int t = 0; t < ratio; t++) den += std::exp(gate[(g * ratio + t) * hd + ch] - mx);
            for (int t = 0; t < ratio; t++) {
                float e = std::exp(gate[(g * ratio + t) * hd + ch] - mx) / den;
                num += kv[(g * ratio + t) * hd + ch] * e;
            }
            latent[g * hd + ch] = num;
        }
}

void index_scores(const float *q, const float *keys, const float *w, int64_t S, int64_t T, int64_t ih, int64_t ihd,
                  int64_t p0, int ratio, bool official, float *scores) {
    const float qk_scale = 1.0f / std::sqrt(float(ihd)), head_scale = 1.0f / std::sqrt(float(ih));
    parallel_for(S, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; s++) {
            const int64_t visible = (p0 + s + 1) / ratio;
            for (int64_t t = 0; t < T; t++) {
                if (t >= visible) {
                    scores[s * T + t] = NEG_INF;
                    continue;
                }
                const float *kt = keys + t * ihd;
                float acc = 0;
                for (int64_t h = 0; h < ih; h++) {
                    const float dot = cpu::dot(q + (s * ih + h) * ihd, kt, ihd);
                    if (official) {
                        // The reference's bf16 einsum, relu, weight product and head sum, with
                        // both scales folded into the weights (spec 4.6 item 4).
                        float wh = round_bf16(w[s * ih + h] * (qk_scale * head_scale));
                        acc += round_bf16(std::max(round_bf16(dot), 0.0f) * wh);
                    } else {
                        acc += std::max(dot, 0.0f) * qk_scale * (w[s * ih + h] * head_scale);
                    }
                }
                scores[s * T + t] = official ? round_bf16(acc) : acc;
            }
        }
    });
}

// Ties in OFFICIAL numerics (bf16 scores, frequent ties) go to the lower index.
std::vector<int64_t> select_top(const float *v, int64_t n, int64_t k, bool official) {
    return official ? top_indices_ordered(v, n, k) : top_indices(v, n, k);
}

std::vector<std::vector<uint8_t>> candidate_mask(const model::model_config &c, const float *scores, int64_t S,
                                                 int64_t T, int64_t p0, int ratio, bool official) {
    const int64_t bs = c.candidate_block_size, nb = (T + bs - 1) / bs;
    std::vector<std::vector<uint8_t>> mask(size_t(S), std::vector<uint8_t>(size_t(T), 0));
    for (int64_t s = 0; s < S; s++) {
        std::vector<float> bscore(nb, NEG_INF);
        for (int64_t t = 0; t < T; t++) bscore[size_t(t / bs)] = std::max(bscore[size_t(t / bs)], scores[s * T + t]);
        const int64_t visible = (p0 + s + 1) / ratio;
        if (visible >= 1) bscore[size_t((visible - 1) / bs)] = std::numeric_limits<float>::infinity();
        for (int64_t b : select_top(bscore.data(), nb, std::min<int64_t>(c.candidate_topk_blocks, nb), official))
            for (int64_t t = b * bs; t < std::min(T, (b + 1) * bs); t++) mask[size_t(s)][size_t(t)] = 1;
    }
    return mask;
}

void apply_candidate_mask(const std::vector<std::vector<uint8_t>> &mask, int64_t S, int64_t T, float *scores) {
    for (int64_t s = 0; s < S; s++)
        for (int64_t t = 0; t < T; t++)
            if (!mask[size_t(s)][size_t(t)]) scores[s * T + t] = NEG_INF;
}

void engram_gate(float *X, const float *kv, const float *q, const float *kw, int64_t S, int hc, int64_t D, float eps,
                 bool official) {
    const int64_t out_w = int64_t(hc + 1) * D;
    for (int64_t s = 0; s < S; s++) {
        const float *key = kv + s * out_w, *value = key + hc * D;
        for (int j = 0; j < hc; j++) {
            float *h = X + (s * hc + j) * D;
            const float *kj = key + j * D;
            double hh = 0, kk = 0;
            for (int64_t d = 0; d < D; d++) {
                hh += double(h[d]) * h[d];
                kk += double(kj[d]) * kj[d];
            }
            float rstd =
                (1.0f / std::sqrt(float(hh / double(D)) + eps)) * (1.0f / std::sqrt(float(kk / double(D)) + eps));
            double acc = 0;
            for (int64_t d = 0; d < D; d++) acc += double(h[d]) * (q[j * D + d] * kw[j * D + d]) * kj[d];
            const float dot = float(acc) * rstd * (1.0f / std::sqrt(float(D)));
            float g = cpu::sigmoid(std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6f)), dot));
            for (int64_t d = 0; d < D; d++) h[d] = h[d] + g * value[d];
            cpu::round_bf16_if(official, h, D);
        }
    }
}

cpu::route_table route(const model::model_config &c, const float *logits, const float *bias, int64_t S) {
    const int64_t E = c.n_routed_experts, K = c.n_activated_experts;
    cpu::route_table rt;
    rt.offsets.push_back(0);
    std::vector<float> score(E), biased(E);
    for (int64_t s = 0; s < S; s++) {
        for (int64_t e = 0; e < E; e++) {
            float v = logits[s * E + e] / c.gate_temp;
            float sp = v > 20.0f ? v : std::log1p(std::exp(v));  // torch softplus threshold
            score[size_t(e)] = std::sqrt(sp);
            biased[size_t(e)] = score[size_t(e)] + bias[e];
        }
        std::vector<int64_t> sel = top_indices(biased.data(), E, K);
        float sum = 0;
        for (int64_t e : sel) sum += score[size_t(e)];
        for (int64_t e : sel) {
            float wgt = score[size_t(e)];
            if (c.norm_topk_prob && K > 1) wgt = wgt / (sum + 1e-20f);
            rt.routes.push_back({uint32_t(e), wgt * c.route_scale});
        }
        rt.offsets.push_back(uint32_t(rt.routes.size()));
    }
    return rt;
}

}  // namespace ds41rt::engine::v41
