// Weights: catalog checks and dequantization to fp32 (see weights.h).
//
// Every read goes through resolve(), which verifies the stored dtype and shape of a tensor and of
// its .scale before any byte is indexed, so a malformed checkpoint is a Status naming the tensor,
// file and byte offset, never an out-of-bounds read. Dequantization uses 256-entry tables for
// e4m3 and e8m0: exact (each entry is the format's definition) and an order of magnitude faster
// than decoding bits per element on multi-GB tensors.
#include "model/weights.h"

#include <array>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "model/exl3.h"
#include "model/nvfp4.h"

namespace ds41rt::model {

struct weights::cache_slot {
    std::once_flag once;
    Tensor value;
    Status status;
};

namespace {

const std::array<float, 256> &e4m3_table() {
    static const std::array<float, 256> t = [] {
        std::array<float, 256> a{};
        for (int i = 0; i < 256; i++) a[size_t(i)] = e4m3_to_f32(uint8_t(i));
        return a;
    }();
    return t;
}

const std::array<float, 256> &e8m0_table() {
    static const std::array<float, 256> t = [] {
        std::array<float, 256> a{};
        for (int i = 0; i < 256; i++) a[size_t(i)] = e8m0_to_f32(uint8_t(i));
        return a;
    }();
    return t;
}

bool is_float(dtype t) {
    return t == dtype::F32 || t == dtype::F64 || t == dtype::F16 || t == dtype::BF16 || t == dtype::F8_E4M3 ||
           t == dtype::F8_E8M0 || t == dtype::F4_E2M1;
}

bool is_plain(storage_format f) { return f == storage_format::BF16 || f == storage_format::F32; }

std::string describe(dtype t, const shape_t &s) { return fmt::format("{} {}", dtype_name(t), shape_str(s)); }

Status mismatch(const std::string &name, const std::string &expected, const io::tensor_info &got) {
    return Status::corruption(fmt::format("tensor {}: expected {} got {} in file {} at byte {}", name, expected,
                                          describe(got.type, got.shape), got.file, got.data_offset));
}

Status absent(const std::string &name, const std::string &expected) {
    return Status::not_found(fmt::format("tensor {}: missing (expected {})", name, expected));
}

// The stored format of one catalog entry after verifying the weight and its .scale: the release
// format, or BF16 / F32 when the plain variant stores the logical tensor without a .scale.
// NVFP4 / EXL3 entries: every companion present with its dtype and shape. An EXL3 trellis may
// carry any K in 1..8 (K is per tensor; the config's bits only sets the catalog's default), and the
// codebook scalar must be the one the config announces.
Result<storage_format> resolve_quantized_expert(const io::checkpoint &ck, const model_config &c, const catalog_entry &e) {
    const std::vector<stored_tensor> want = stored_tensors(e, c);
    for (size_t i = 0; i < want.size(); i++) {
        const stored_tensor &s = want[i];
        const io::tensor_info *info = ck.find(s.name);
        if (!info) return absent(s.name, describe(s.type, s.shape));
        bool ok = info->type == s.type && info->shape == s.shape;
        if (e.format == storage_format::EXL3 && i == 0)
            ok = info->type == s.type && info->shape.size() == 3 && info->shape[0] == s.shape[0] &&
                 info->shape[1] == s.shape[1] && info->shape[2] % 16 == 0 && info->shape[2] >= 16 &&
                 info->shape[2] <= 128;
        if (!ok) return mismatch(s.name, describe(s.type, s.shape), *info);
    }
    if (e.format == storage_format::EXL3) {
        for (const char *cb : {"mcg", "mul1"}) {
            const std::string n = companion_name(e.name, cb);
            if (ck.has(n) && !(exl3_codebook_name(c.exl3_cb) == std::string_view(cb)))
                return Status::corruption(fmt::format("tensor {}: present, but quantization_config.codebook is {}", n,
                                                      exl3_codebook_name(c.exl3_cb)));
        }
    }
    return e.format;
}

Result<storage_format> resolve(const io::checkpoint &ck, const model_config &c, const catalog_entry &e) {
    if (e.format == storage_format::NVFP4 || e.format == storage_format::EXL3) return resolve_quantized_expert(ck, c, e);
    const std::vector<stored_tensor> want = stored_tensors(e, c);
    const stored_tensor &w = want[0];
    const io::tensor_info *info = ck.find(e.name);
    if (!info) return absent(e.name, describe(w.type, w.shape));

    const bool quantized = want.size() == 2;
    const bool plain_dtype = info->type == dtype::BF16 || info->type == dtype::F32;
    if (is_plain(e.format) || (quantized && plain_dtype && !ck.has(want[1].name))) {
        // Plain storage: any bf16/f32 spelling of the logical shape.
        if (!plain_dtype || info->shape != e.shape) return mismatch(e.name, describe(w.type, w.shape), *info);
        return info->type == dtype::BF16 ? storage_format::BF16 : storage_format::F32;
    }
    if (e.format == storage_format::I64) {
        if (info->type != dtype::I64 || info->shape != w.shape) return mismatch(e.name, describe(w.type, w.shape), *info);
        return storage_format::I64;
    }

    // Quantized: the weight in its packed dtype (MXFP4 also as U8 bytes or F4 elements), then the scale.
    bool weight_ok = info->type == w.type && info->shape == w.shape;
    if (e.format == storage_format::MXFP4)
        weight_ok = weight_ok || (info->type == dtype::U8 && info->shape == w.shape) ||
                    (info->type == dtype::F4_E2M1 && info->shape == e.shape);
    if (!weight_ok) return mismatch(e.name, describe(w.type, w.shape), *info);
    const stored_tensor &s = want[1];
    const io::tensor_info *sinfo = ck.find(s.name);
    if (!sinfo) return absent(s.name, describe(s.type, s.shape));
    if (sinfo->type != s.type || sinfo->shape != s.shape) return mismatch(s.name, describe(s.type, s.shape), *sinfo);
    return e.format;
}

// ---- dequantizers: shapes were verified by resolve() ----

Tensor dequant_fp8_block(const Tensor &w, const Tensor &s, int64_t bo, int64_t bi) {
    const int64_t rows = w.dim(0), cols = w.dim(1), scols = s.dim(1);
    const auto &q = e4m3_table();
    const auto &x = e8m0_table();
    Tensor out = Tensor::f32({rows, cols});
    const uint8_t *wp = w.data<uint8_t>();
    const uint8_t *sp = s.data<uint8_t>();
    float *op = out.f();
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *srow = sp + (r / bo) * scols;
        for (int64_t i = 0; i < cols; i++) op[r * cols + i] = q[wp[r * cols + i]] * x[srow[i / bi]];
    }
    return out;
}

// MXFP4 packed bytes [rows, cols/2]: low nibble is the even element; one e8m0 per (row, 32 cols).
Tensor dequant_mxfp4(const Tensor &w, const Tensor &s, int64_t rows, int64_t cols) {
    const int64_t scols = s.dim(1);
    const auto &x = e8m0_table();
    float lut[16];
    for (int i = 0; i < 16; i++) lut[i] = e2m1_to_f32(uint8_t(i));
    Tensor out = Tensor::f32({rows, cols});
    const uint8_t *wp = w.data<uint8_t>();
    const uint8_t *sp = s.data<uint8_t>();
    float *op = out.f();
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = wp + r * (cols / 2);
        for (int64_t i = 0; i < cols; i++) op[r * cols + i] = lut[e2m1_unpack(row, size_t(i))] * x[sp[r * scols + i / 32]];
    }
    return out;
}

// One Engram row: F8_E4M3 values with one e8m0 per 32 channels of that row.
void dequant_engram_row(const uint8_t *w, const uint8_t *s, int64_t d, float *out) {
    const auto &q = e4m3_table();
    const auto &x = e8m0_table();
    for (int64_t j = 0; j < d; j++) out[j] = q[w[j]] * x[s[j / 32]];
}

}  // namespace

// ---- open ---------------------------------------------------------------------------------------

Result<std::unique_ptr<weights>> weights::open(const std::string &dir) {
    Result<model_config> c = load_config(dir);
    if (!c) return c.status();
    return open(dir, std::move(c.value()));
}

Result<std::unique_ptr<weights>> weights::open(const std::string &dir, model_config cfg) {
    Status st = validate(cfg);
    if (!st) return Status(st.code(), dir + "/config.json: " + st.message());
    Result<io::checkpoint> ck = io::checkpoint::open(dir);
    if (!ck) return ck.status();

    std::unique_ptr<weights> w(new weights());
    w->cfg_ = std::move(cfg);
    w->ckpt_ = std::move(ck.value());
    w->catalog_ = build_catalog(w->cfg_, catalog_scope::ALL);
    for (size_t i = 0; i < w->catalog_.size(); i++) {
        const catalog_entry &e = w->catalog_[i];
        w->by_name_.emplace(e.name, i);
        if (w->ckpt_.has(e.format == storage_format::EXL3 ? companion_name(e.name, "trellis") : e.name))
            w->present_[int(e.part)] = true;
    }
    return w;
}

const catalog_entry *weights::entry(const std::string &name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &catalog_[it->second];
}

bool weights::has_part(model_part p) const { return present_[int(p)]; }

std::vector<model_part> weights::parts_present() const {
    std::vector<model_part> r;
    for (model_part p : {model_part::TEXT, model_part::MTP, model_part::VISION})
        if (has_part(p)) r.push_back(p);
    return r;
}

// ---- check --------------------------------------------------------------------------------------

Status weights::check() {
    report_ = check_report{};
    Status first;
    std::unordered_map<std::string, bool> explained;  // stored names the catalog accounts for
    for (const catalog_entry &e : catalog_) {
        for (const stored_tensor &s : stored_tensors(e, cfg_)) explained[s.name] = true;
        // The text part must be complete; optional parts are verified once any of them is present.
        if (e.part != model_part::TEXT && !has_part(e.part)) continue;
        report_.checked++;
        Result<storage_format> f = resolve(ckpt_, cfg_, e);
        if (f) continue;
        Status st = f.status();
        if (st.code() == status_code::NOT_FOUND)  // the weight itself, or one of its companions
            for (const stored_tensor &s : stored_tensors(e, cfg_))
                if (!ckpt_.has(s.name)) {
                    report_.missing.push_back(s.name);
                    break;
                }
        report_.problems.push_back(st.message());
        if (first.is_ok()) first = st;
    }
    if (first.is_ok() && cfg_.routed_quant == expert_quant::NVFP4) first = check_nvfp4_gate_up();
    for (const std::string &n : ckpt_.names())
        if (!explained.count(n)) report_.unexpected.push_back(n);
    if (first.is_ok()) return first;
    if (report_.problems.size() > 1)
        return Status(first.code(), fmt::format("{} (and {} more problems)", first.message(), report_.problems.size() - 1));
    return first;
}

// ---- access -------------------------------------------------------------------------------------

Result<storage_format> weights::format(const std::string &name) const {
    const catalog_entry *e = entry(name);
    if (!e) return Status::not_found("tensor " + name + ": not in the " + std::string(arch_name(cfg_.model_arch)) + " catalog");
    return resolve(ckpt_, cfg_, *e);
}

Result<Tensor> weights::raw(const std::string &name) const { return ckpt_.get(name); }

Result<Tensor> weights::f32(const std::string &name) const {
    std::shared_ptr<cache_slot> slot;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto &s = cache_[name];
        if (!s) s = std::make_shared<cache_slot>();
        slot = s;
    }
    // Outside the map lock: other tensors dequantize in parallel; callers of this one wait here.
    std::call_once(slot->once, [&] {
        Result<Tensor> t = dequantize(name);
        if (t)
            slot->value = std::move(t.value());
        else
            slot->status = t.status();
    });
    if (!slot->status.is_ok()) return slot->status;
    return slot->value;
}

Result<Tensor> weights::dequantize(const std::string &name) const {
    const catalog_entry *e = entry(name);
    if (!e) {
        Result<Tensor> t = ckpt_.get(name);
        if (!t) return t.status();
        if (!is_float(t->type()))
            return Status::not_supported(fmt::format("tensor {}: {} has no fp32 view", name, dtype_name(t->type())));
        return t->to_f32();
    }
    Result<storage_format> f = resolve(ckpt_, cfg_, *e);
    if (!f) return f.status();
    if (*f == storage_format::NVFP4) {
        Result<nvfp4_linear> l = nvfp4(name);
        if (!l) return l.status();
        Tensor out = Tensor::f32({l->out, l->in});
        nvfp4_dequantize(*l, out.f());
        return out;
    }
    if (*f == storage_format::EXL3) {
        // The logical [out, in] of every other linear: EXL3's W[in, out] transposed.
        Result<exl3_linear> l = exl3(name);
        if (!l) return l.status();
        std::vector<float> w(size_t(l->in * l->out));
        exl3_dequantize(*l, w.data());
        Tensor out = Tensor::f32({l->out, l->in});
        for (int64_t i = 0; i < l->in; i++)
            for (int64_t o = 0; o < l->out; o++) out.f()[o * l->in + i] = w[size_t(i * l->out + o)];
        return out;
    }
    Result<Tensor> w = ckpt_.get(name);
    if (!w) return w.status();
    switch (*f) {
    case storage_format::BF16:
    case storage_format::F32:
        return w->to_f32();
    case storage_format::I64: {
        // Expert ids are small integers: exact in fp32.
        Tensor out = Tensor::f32(w->shape());
        const int64_t *p = w->data<int64_t>();
        for (int64_t i = 0; i < w->numel(); i++) out.f()[i] = float(p[i]);
        return out;
    }
    default:
        break;
    }
    Result<Tensor> s = ckpt_.get(scale_name(name));
    if (!s) return s.status();
    switch (*f) {
    case storage_format::FP8_BLOCK:
        return dequant_fp8_block(*w, *s, cfg_.fp8_block_out, cfg_.fp8_block_in);
    case storage_format::MXFP4:
        return dequant_mxfp4(*w, *s, e->shape[0], e->shape[1]);
    case storage_format::ENGRAM_TABLE: {
        const int64_t rows = e->shape[0], d = e->shape[1], sd = s->dim(1);
        Tensor out = Tensor::f32({rows, d});
        for (int64_t r = 0; r < rows; r++)
            dequant_engram_row(w->data<uint8_t>() + r * d, s->data<uint8_t>() + r * sd, d, out.f() + r * d);
        return out;
    }
    default:
        return Status::internal("tensor " + name + ": unhandled storage format");
    }
}

Result<nvfp4_linear> weights::nvfp4(const std::string &name) const {
    const catalog_entry *e = entry(name);
    if (!e || e->format != storage_format::NVFP4)
        return Status::invalid_argument("tensor " + name + ": not an NVFP4 entry of the catalog");
    Result<storage_format> f = resolve(ckpt_, cfg_, *e);
    if (!f) return f.status();
    Result<Tensor> q = ckpt_.get(name), s = ckpt_.get(companion_name(name, "weight_scale")),
                   s2 = ckpt_.get(companion_name(name, "weight_scale_2")), in = ckpt_.get(companion_name(name, "input_scale"));
    for (const Result<Tensor> *t : {&q, &s, &s2, &in})
        if (!*t) return t->status();
    nvfp4_linear l;
    l.out = e->shape[0];
    l.in = e->shape[1];
    l.codes = q->data<uint8_t>();
    l.scales = s->data<uint8_t>();
    std::memcpy(&l.weight_scale_2, s2->raw(), 4);
    std::memcpy(&l.input_scale, in->raw(), 4);
    std::string p = name.substr(0, name.size() - std::string(".weight").size());
    DS41RT_RETURN_IF_ERROR(nvfp4_check(p, l));
    return l;
}

Result<exl3_linear> weights::exl3(const std::string &name) const {
    const catalog_entry *e = entry(name);
    if (!e || e->format != storage_format::EXL3)
        return Status::invalid_argument("tensor " + name + ": not an EXL3 entry of the catalog");
    Result<storage_format> f = resolve(ckpt_, cfg_, *e);
    if (!f) return f.status();
    Result<Tensor> t = ckpt_.get(companion_name(name, "trellis")), su = ckpt_.get(companion_name(name, "suh")),
                   sv = ckpt_.get(companion_name(name, "svh"));
    for (const Result<Tensor> *x : {&t, &su, &sv})
        if (!*x) return x->status();
    exl3_linear l;
    l.out = e->shape[0];
    l.in = e->shape[1];
    l.k = int(t->dim(2) / 16);
    l.cb = cfg_.exl3_cb;
    l.trellis = t->data<uint16_t>();
    l.suh = su->data<uint16_t>();
    l.svh = sv->data<uint16_t>();
    std::string p = name.substr(0, name.size() - std::string(".weight").size());
    DS41RT_RETURN_IF_ERROR(exl3_check(p, l));
    return l;
}

// ModelOpt fuses the amax of modules sharing an input, so w1 (gate) and w3 (up) of one expert carry
// the same weight_scale_2 and input_scale, and the fused kernels apply one alpha to both halves.
// A checkpoint that breaks this would be computed wrongly without a word: refuse it by name.
Status weights::check_nvfp4_gate_up() const {
    for (const catalog_entry &e : catalog_) {
        if (e.format != storage_format::NVFP4) continue;
        const std::string &n = e.name;
        const size_t at = n.rfind(".w1.weight");
        if (at == std::string::npos || at + 10 != n.size()) continue;
        const std::string up = n.substr(0, at) + ".w3.weight";
        for (const char *sfx : {"weight_scale_2", "input_scale"}) {
            Result<Tensor> a = ckpt_.get(companion_name(n, sfx)), b = ckpt_.get(companion_name(up, sfx));
            if (!a) return a.status();
            if (!b) return b.status();
            uint32_t x, y;
            std::memcpy(&x, a->raw(), 4);
            std::memcpy(&y, b->raw(), 4);
            if (x != y)
                return Status::corruption(fmt::format("tensor {}: {} differs from {} ({}); gate and up must share it",
                                                      companion_name(up, sfx), f32_from_bits(y), companion_name(n, sfx),
                                                      f32_from_bits(x)));
        }
    }
    return Status::ok();
}

Status weights::engram_row(int layer, int64_t row, float *out) const {
    const std::string name = "layers." + std::to_string(layer) + ".engram.embed.weight";
    const catalog_entry *e = entry(name);
    if (!e) return Status::invalid_argument(fmt::format("engram_row: layer {} has no Engram table", layer));
    const int64_t rows = e->shape[0], d = e->shape[1];
    if (row < 0 || row >= rows)
        return Status::invalid_argument(fmt::format("engram_row: row {} outside [0, {}) of {}", row, rows, name));
    Result<storage_format> f = resolve(ckpt_, cfg_, *e);
    if (!f) return f.status();
    Result<Tensor> w = ckpt_.get(name);
    if (!w) return w.status();
    if (*f == storage_format::ENGRAM_TABLE) {
        Result<Tensor> s = ckpt_.get(scale_name(name));
        if (!s) return s.status();
        const int64_t sd = s->dim(1);
        dequant_engram_row(w->data<uint8_t>() + row * d, s->data<uint8_t>() + row * sd, d, out);
        return Status::ok();
    }
    // Plain variant: one row of bf16 / f32.
    const size_t row_bytes = dtype_bytes(w->type(), size_t(d));
    to_f32(w->type(), w->data<uint8_t>() + size_t(row) * row_bytes, out, size_t(d));
    return Status::ok();
}

}  // namespace ds41rt::model
