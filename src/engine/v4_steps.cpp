#include "engine/v4_steps.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/topk.h"

namespace ds41rt::engine::v4 {

namespace cpu = backend::cpu;

namespace {
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
}

std::vector<float> compress_pool(compressor_buffer &st, const float *kv, const float *gate, int64_t S, int64_t d,
                                 int ratio, bool overlap, const float *ape, int64_t *groups_out) {
    const int64_t cd = (overlap ? 2 : 1) * d;
    st.buf_kv.insert(st.buf_kv.end(), kv, kv + S * cd);
    st.buf_gate.insert(st.buf_gate.end(), gate, gate + S * cd);
    st.n_buf += S;
    const int64_t groups = st.n_buf / ratio;
    *groups_out = groups;
    if (groups == 0) return {};
    // Add the absolute-position bias: buffered windows start at multiples of m.
    for (int64_t r = 0; r < groups * ratio; r++)
        for (int64_t ch = 0; ch < cd; ch++) st.buf_gate[size_t(r * cd + ch)] += ape[(r % ratio) * cd + ch];
    std::vector<float> latent(groups * d);
    const int nslots = overlap ? 2 * ratio : ratio;
    std::vector<const float *> skv(nslots), sgate(nslots);
    std::vector<float> e(nslots);
    for (int64_t g = 0; g < groups; g++) {
        // Slot pointers (each row already offset to its half).
        int n = 0;
        if (overlap) {
            const bool has_prev = g > 0 || st.has_prev;
            if (has_prev)
                for (int t = 0; t < ratio; t++) {
                    if (g > 0) {
                        skv[n] = st.buf_kv.data() + ((g - 1) * ratio + t) * cd;  // Ca = [:d]
                        sgate[n] = st.buf_gate.data() + ((g - 1) * ratio + t) * cd;
                    } else {
                        skv[n] = st.prev_kv.data() + t * d;
                        sgate[n] = st.prev_gate.data() + t * d;
                    }
                    n++;
                }
            for (int t = 0; t < ratio; t++) {  // Cb = [d:]
                skv[n] = st.buf_kv.data() + (g * ratio + t) * cd + d;
                sgate[n] = st.buf_gate.data() + (g * ratio + t) * cd + d;
                n++;
            }
        } else {
            for (int t = 0; t < ratio; t++) {
                skv[n] = st.buf_kv.data() + (g * ratio + t) * cd;
                sgate[n] = st.buf_gate.data() + (g * ratio + t) * cd;
                n++;
            }
        }
        for (int64_t ch = 0; ch < d; ch++) {
            // Softmax over the slots, independently per channel, in fp32.
            float mx = NEG_INF;
            for (int i = 0; i < n; i++) mx = std::max(mx, sgate[i][ch]);
            float den = 0;
            for (int i = 0; i < n; i++) den += (e[i] = std::exp(sgate[i][ch] - mx));
            float num = 0;
            for (int i = 0; i < n; i++) num += skv[i][ch] * (e[i] / den);
            latent[size_t(g * d + ch)] = num;
        }
    }
    if (overlap) {  // keep the last closed window's Ca half for the next call
        st.prev_kv.resize(size_t(ratio * d));
        st.prev_gate.resize(size_t(ratio * d));
        for (int t = 0; t < ratio; t++) {
            const size_t row = size_t(((groups - 1) * ratio + t) * cd);
            std::copy(st.buf_kv.begin() + long(row), st.buf_kv.begin() + long(row + d), st.prev_kv.begin() + t * d);
            std::copy(st.buf_gate.begin() + long(row), st.buf_gate.begin() + long(row + d),
                      st.prev_gate.begin() + t * d);
        }
        st.has_prev = true;
    }
    const size_t used = size_t(groups * ratio * cd);
    st.buf_kv.erase(st.buf_kv.begin(), st.buf_kv.begin() + long(used));
    st.buf_gate.erase(st.buf_gate.begin(), st.buf_gate.begin() + long(used));
    st.n_buf -= groups * ratio;
    return latent;
}

cpu::route_table route(const model::model_config &c, const float *logits, int64_t S, const int32_t *tid2eid,
                       const float *bias, const int32_t *tokens, bool official) {
    const int64_t E = c.n_routed_experts, K = c.n_activated_experts;
    const bool hash = tid2eid != nullptr;
    cpu::route_table rt;
    rt.offsets.push_back(0);
    for (int64_t s = 0; s < S; s++) {
        std::vector<float> score(E), biased(E);
        for (int64_t e = 0; e < E; e++) {
            const float v = logits[size_t(s * E + e)];
            const float sp = v > 20.0f ? v : std::log1p(std::exp(v));  // torch softplus threshold
            score[size_t(e)] = std::sqrt(sp);
            if (!hash) biased[size_t(e)] = score[size_t(e)] + bias[e];
        }
        std::vector<int64_t> sel;
        if (hash) {
            // Hash layers: experts from tid2eid[token]; the learned gate still weights them.
            const int32_t *row = tid2eid + int64_t(tokens[size_t(s)]) * K;
            sel.assign(row, row + K);
        } else {
            sel = top_indices(biased.data(), E, K);  // the bias steers selection only
        }
        // transformers deviation (4): always renormalised, with +1e-20 (OFFICIAL: without).
        float sum = 0;
        for (int64_t e : sel) sum += score[size_t(e)];
        const float den = official ? sum : sum + 1e-20f;
        for (int64_t e : sel) rt.routes.push_back({uint32_t(e), score[size_t(e)] / den * c.route_scale});
        rt.offsets.push_back(uint32_t(rt.routes.size()));
    }
    return rt;
}

}  // namespace ds41rt::engine::v4
