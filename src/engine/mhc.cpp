#include "engine/mhc.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/ops.h"

namespace ds41rt::engine {

namespace cpu = backend::cpu;

void hc_project(const float *X, int64_t S, int64_t flat, const Tensor &fn, int64_t n_out, float eps, bool fold_after,
                float *m) {
    if (fold_after) {
        cpu::matmul_nt(X, fn.f(), m, S, n_out, flat);
        for (int64_t s = 0; s < S; s++) {
            const float rs = 1.0f / std::sqrt(float(double(cpu::dot(X + s * flat, X + s * flat, flat)) / double(flat)) + eps);
            for (int64_t j = 0; j < n_out; j++) m[s * n_out + j] *= rs;
        }
        return;
    }
    std::vector<float> normed(S * flat);
    cpu::rms_norm(X, nullptr, normed.data(), S, flat, eps);
    cpu::matmul_nt(normed.data(), fn.f(), m, S, n_out, flat);
}

hc_mixes hc_split_sinkhorn(const float *m, int64_t S, int hc, const float *sc, const float *b, float eps, int iters) {
    const int64_t n_mix = int64_t(2 + hc) * hc;
    hc_mixes r;
    r.pre.resize(size_t(S * hc));
    r.post.resize(size_t(S * hc));
    r.comb.resize(size_t(S * hc * hc));
    for (int64_t s = 0; s < S; s++) {
        const float *ms = m + s * n_mix;
        for (int j = 0; j < hc; j++) {
            r.pre[size_t(s * hc + j)] = cpu::sigmoid(ms[j] * sc[0] + b[j]) + eps;
            r.post[size_t(s * hc + j)] = 2.0f * cpu::sigmoid(ms[hc + j] * sc[1] + b[hc + j]);
        }
        float *C = r.comb.data() + s * hc * hc;
        for (int j = 0; j < hc; j++) {  // softmax over k, then + eps
            float mx = -std::numeric_limits<float>::infinity();
            for (int k = 0; k < hc; k++) {
                C[j * hc + k] = ms[2 * hc + j * hc + k] * sc[2] + b[2 * hc + j * hc + k];
                mx = std::max(mx, C[j * hc + k]);
            }
            float sum = 0;
            for (int k = 0; k < hc; k++) sum += (C[j * hc + k] = std::exp(C[j * hc + k] - mx));
            for (int k = 0; k < hc; k++) C[j * hc + k] = C[j * hc + k] / sum + eps;
        }
        auto col_norm = [&] {
            for (int k = 0; k < hc; k++) {
                float sum = 0;
                for (int j = 0; j < hc; j++) sum += C[j * hc + k];
                for (int j = 0; j < hc; j++) C[j * hc + k] /= sum + eps;
            }
        };
        auto row_norm = [&] {
            for (int j = 0; j < hc; j++) {
                float sum = 0;
                for (int k = 0; k < hc; k++) sum += C[j * hc + k];
                for (int k = 0; k < hc; k++) C[j * hc + k] /= sum + eps;
            }
        };
        col_norm();
        for (int it = 0; it < iters - 1; it++) {
            row_norm();
            col_norm();
        }
    }
    return r;
}

void hc_collapse(const float *X, const float *pre, int64_t S, int hc, int64_t D, float *x) {
    for (int64_t s = 0; s < S; s++)
        for (int64_t d = 0; d < D; d++) {
            float acc = 0;
            for (int j = 0; j < hc; j++) acc += pre[s * hc + j] * X[(s * hc + j) * D + d];
            x[s * D + d] = acc;
        }
}

void hc_expand(float *X, const float *y, const hc_mixes &mx, int64_t S, int hc, int64_t D) {
    std::vector<float> res(hc * D);
    for (int64_t s = 0; s < S; s++) {
        float *Xs = X + s * hc * D;
        std::copy(Xs, Xs + hc * D, res.begin());
        const float *C = mx.comb.data() + s * hc * hc;
        for (int k = 0; k < hc; k++)
            for (int64_t d = 0; d < D; d++) {
                float acc = 0;
                for (int j = 0; j < hc; j++) acc += C[j * hc + k] * res[size_t(j * D + d)];
                Xs[k * D + d] = mx.post[size_t(s * hc + k)] * y[s * D + d] + acc;
            }
    }
}

}  // namespace ds41rt::engine
