// The device sampler's inputs staged in one upload and its outputs read back in one copy.
#include "engine/cuda/device_sampling.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/sampling.cuh"

namespace ds41rt::engine::gpu {

namespace cu = backend::cuda;

bool device_samples(const device_model &m) { return m.device().cc_major >= 9; }

namespace {

size_t align16(size_t n) { return (n + 15) & ~size_t(15); }

}  // namespace

Status sample_on_device(const device_model &m, const float *lg, int64_t V, const std::vector<const sample_spec *> &specs,
                        std::vector<sample_result> *out) {
    const int B = int(specs.size());
    out->assign(size_t(B), sample_result{});
    if (B == 0) return Status::ok();
    constexpr int TOP = cu::SAMPLING_MAX_TOP_LOGPROBS;

    // Inputs: rows [B], the rows' (token, count) pairs, and the masks [B, mask_words] when any
    // row has one (a shorter mask's missing words disallow, as on the host).
    std::vector<cu::sampling_row> rows(static_cast<size_t>(B));
    std::vector<backend::cpu::token_count> counts;
    int mask_words = 0;
    for (int i = 0; i < B; i++) {
        const sample_spec &s = *specs[size_t(i)];
        cu::sampling_row &r = rows[size_t(i)];
        r.p = s.p;
        r.seed = s.seed;
        r.position = s.position;
        r.counts_begin = int32_t(counts.size());
        r.counts_len = int32_t(s.counts.size());
        counts.insert(counts.end(), s.counts.begin(), s.counts.end());
        r.has_mask = !s.allowed.empty();
        r.logprobs = s.logprobs;
        r.top_logprobs = s.logprobs ? std::clamp(s.top_logprobs, 0, TOP) : 0;
        mask_words = std::max(mask_words, int(s.allowed.size()));
    }
    const size_t rows_at = 0, counts_at = align16(rows.size() * sizeof(cu::sampling_row));
    const size_t mask_at = align16(counts_at + counts.size() * sizeof(backend::cpu::token_count));
    const size_t in_bytes = mask_at + size_t(B) * size_t(mask_words) * sizeof(uint32_t);
    std::vector<uint8_t> staged(in_bytes, 0);
    std::memcpy(staged.data() + rows_at, rows.data(), rows.size() * sizeof(cu::sampling_row));
    if (!counts.empty()) std::memcpy(staged.data() + counts_at, counts.data(), counts.size() * sizeof(counts[0]));
    for (int i = 0; i < B; i++) {
        const auto &a = specs[size_t(i)]->allowed;
        if (!a.empty())
            std::memcpy(staged.data() + mask_at + size_t(i) * size_t(mask_words) * 4, a.data(), a.size() * 4);
    }
    auto in = m.upload_temp(staged.data(), staged.size());
    if (!in) return in.status();

    // Outputs, one block read back at once: tokens [B], logprob [B], top ids [B, 20], top
    // logprobs [B, 20] (all 4-byte words).
    const size_t out_words = size_t(B) * (2 + 2 * TOP);
    dtemp outs = m.temp(out_words * 4);
    dtemp work = m.temp(cu::sampling_workspace_bytes(B, int(V)));
    if (!outs.as<void>() || !work.as<void>()) return Status::resource_exhausted("sampling: no device memory");
    uint8_t *o = outs.as<uint8_t>();
    cu::sampling_batch b;
    b.B = B;
    b.V = int(V);
    b.logits = lg;
    b.ld = V;
    b.rows = reinterpret_cast<const cu::sampling_row *>(in->as<uint8_t>() + rows_at);
    b.counts = reinterpret_cast<const backend::cpu::token_count *>(in->as<uint8_t>() + counts_at);
    if (mask_words > 0) {
        b.allowed = reinterpret_cast<const uint32_t *>(in->as<uint8_t>() + mask_at);
        b.mask_words = mask_words;
    }
    b.workspace = work.as<void>();
    b.tokens = reinterpret_cast<int32_t *>(o);
    b.logprob = reinterpret_cast<float *>(o + size_t(B) * 4);
    b.top_ids = reinterpret_cast<int32_t *>(o + size_t(B) * 8);
    b.top_logprobs = reinterpret_cast<float *>(o + size_t(B) * (8 + 4 * TOP));
    DS41RT_RETURN_IF_ERROR(cu::run_sampling(b, m.stream()));

    std::vector<uint32_t> host(out_words);
    DS41RT_RETURN_IF_ERROR(m.to_host(host.data(), o, out_words * 4));
    const auto *tokens = reinterpret_cast<const int32_t *>(host.data());
    const auto *logprob = reinterpret_cast<const float *>(host.data() + B);
    const auto *top_ids = reinterpret_cast<const int32_t *>(host.data() + 2 * B);
    const auto *top_lp = reinterpret_cast<const float *>(host.data() + size_t(B) * (2 + TOP));
    for (int i = 0; i < B; i++) {
        sample_result &r = (*out)[size_t(i)];
        r.token = tokens[i];
        if (!rows[size_t(i)].logprobs) continue;
        r.logprob = logprob[i];
        for (int k = 0; k < rows[size_t(i)].top_logprobs; k++)
            if (top_ids[size_t(i) * TOP + k] >= 0)
                r.top.push_back({top_ids[size_t(i) * TOP + k], top_lp[size_t(i) * TOP + k]});
    }
    return Status::ok();
}

Status finish_rows(const device_model &m, const float *lg, int64_t R, int64_t V,
                   const std::vector<const sample_spec *> &samples, std::vector<sample_result> *sampled, float *logits,
                   section_timer &prof) {
    if (samples.empty()) return R > 0 ? m.to_host(logits, lg, size_t(R * V) * sizeof(float)) : m.sync();
    prof.begin("sample", m.stream());
    DS41RT_RETURN_IF_ERROR(sample_on_device(m, lg, V, samples, sampled));
    prof.end(m.stream());
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
