// TP slices of routed-expert projections (expert_slice.h).
#include "model/expert_slice.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "model/catalog.h"
#include "model/exl3.h"
#include "model/nvfp4.h"

namespace ds41rt::model {

namespace {

const char *block_reason(storage_format f) {
    switch (f) {
    case storage_format::NVFP4: return "NVFP4: one E4M3 scale per 16 inputs of w2, and w1 / w3 rows cut with them";
    case storage_format::EXL3:  return "EXL3: the Hadamard rotations and trellis tiles act on 128-channel blocks";
    case storage_format::MXFP4: return "MXFP4: one E8M0 scale per 32 inputs of w2, and w1 / w3 rows cut with them";
    default:                    return "the format's blocks";
    }
}

Tensor cut(const Tensor &w, slice_axis axis, int64_t b, int64_t e) {
    const int64_t rows = w.dim(0), cols = w.dim(1);
    if (axis == slice_axis::OUT) {
        Tensor out = Tensor::f32({e - b, cols});
        std::copy(w.f() + b * cols, w.f() + e * cols, out.f());
        return out;
    }
    Tensor out = Tensor::f32({rows, e - b});
    for (int64_t r = 0; r < rows; r++) std::copy(w.f() + r * cols + b, w.f() + r * cols + e, out.f() + r * (e - b));
    return out;
}

// Each weight decodes from its own code nibble and its row's 16-input block scale, so the decoded
// slice is the slice of the decoded tensor whatever the cut; the 16-alignment keeps the nibble
// pairs and scale blocks whole in the stored bytes. The cut bytes land in codes / scales.
nvfp4_linear nvfp4_cut(const nvfp4_linear &l, slice_axis axis, int64_t b, int64_t e, std::vector<uint8_t> *codes,
                       std::vector<uint8_t> *scales) {
    nvfp4_linear s = l;
    if (axis == slice_axis::OUT) {
        s.out = e - b;
        codes->assign(l.codes + b * (l.in / 2), l.codes + e * (l.in / 2));
        scales->assign(l.scales + b * (l.in / 16), l.scales + e * (l.in / 16));
    } else {
        s.in = e - b;
        codes->resize(size_t(l.out * s.in / 2));
        scales->resize(size_t(l.out * s.in / 16));
        for (int64_t r = 0; r < l.out; r++) {
            std::copy(l.codes + r * (l.in / 2) + b / 2, l.codes + r * (l.in / 2) + e / 2, codes->data() + r * (s.in / 2));
            std::copy(l.scales + r * (l.in / 16) + b / 16, l.scales + r * (l.in / 16) + e / 16,
                      scales->data() + r * (s.in / 16));
        }
    }
    s.codes = codes->data();
    s.scales = scales->data();
    return s;
}

Tensor nvfp4_slice_f32(const nvfp4_linear &l, slice_axis axis, int64_t b, int64_t e) {
    std::vector<uint8_t> codes, scales;
    const nvfp4_linear s = nvfp4_cut(l, axis, b, e, &codes, &scales);
    Tensor out = Tensor::f32({s.out, s.in});
    nvfp4_dequantize(s, out.f());
    return out;
}

// W[in, out] = diag(suh) H What H diag(svh) with H block-diagonal over 128-channel blocks of each
// axis. When b and e are multiples of 128 no block straddles the cut, so W[:, b:e] (the logical
// rows of w1 / w3) is diag(suh) H What[:, b:e] H' diag(svh[b:e]) with H' the same blocks, and
// What[:, b:e] is exactly the trellis tiles of columns b/16 .. e/16; likewise W[b:e, :] (the
// logical columns of w2) uses tile rows b/16 .. e/16 and suh[b:e]. exl3_dequantize runs the same
// fp64 butterflies, block by block, on the same values, then the same per-element scaling: the
// decoded slice is bit-identical to the slice of the decoded tensor. A cut inside a block would
// mix channels of both ranks through H and has no such slice, hence the refusal.
// The cut tiles land in trellis, the cut suh / svh in suh / svh (the other stays the tensor's).
exl3_linear exl3_cut(const exl3_linear &l, slice_axis axis, int64_t b, int64_t e, std::vector<uint16_t> *trellis,
                     std::vector<uint16_t> *suh, std::vector<uint16_t> *svh) {
    exl3_linear s = l;
    const int64_t tile_words = 16 * int64_t(l.k), tb = l.out / 16;
    if (axis == slice_axis::OUT) {  // W's output columns: trellis dim 1 and svh
        s.out = e - b;
        const int64_t sb = s.out / 16;
        trellis->resize(size_t(l.in / 16 * sb * tile_words));
        for (int64_t a = 0; a < l.in / 16; a++)
            std::copy(l.trellis + (a * tb + b / 16) * tile_words, l.trellis + (a * tb + e / 16) * tile_words,
                      trellis->data() + a * sb * tile_words);
        suh->assign(l.suh, l.suh + l.in);
        svh->assign(l.svh + b, l.svh + e);
    } else {  // W's input rows: trellis dim 0 and suh
        s.in = e - b;
        trellis->assign(l.trellis + (b / 16) * tb * tile_words, l.trellis + (e / 16) * tb * tile_words);
        suh->assign(l.suh + b, l.suh + e);
        svh->assign(l.svh, l.svh + l.out);
    }
    s.trellis = trellis->data();
    s.suh = suh->data();
    s.svh = svh->data();
    return s;
}

Tensor exl3_slice_f32(const exl3_linear &l, slice_axis axis, int64_t b, int64_t e) {
    std::vector<uint16_t> trellis, suh, svh;
    const exl3_linear s = exl3_cut(l, axis, b, e, &trellis, &suh, &svh);
    std::vector<float> w(size_t(s.in * s.out));
    exl3_dequantize(s, w.data());
    Tensor out = Tensor::f32({s.out, s.in});  // the logical [out, in]: W transposed
    for (int64_t i = 0; i < s.in; i++)
        for (int64_t o = 0; o < s.out; o++) out.f()[o * s.in + i] = w[size_t(i * s.out + o)];
    return out;
}

// The tensor's storage format once [begin, end) is a non-empty, in-range cut of whole blocks of
// it on `axis`; INVALID_ARGUMENT naming the tensor otherwise.
Result<storage_format> checked_cut(const weights &w, const std::string &name, slice_axis axis, int64_t begin, int64_t end) {
    const catalog_entry *e = w.entry(name);
    if (!e) return Status::not_found("tensor " + name + ": not in the catalog");
    Result<storage_format> f = w.format(name);
    if (!f) return f.status();
    const int64_t extent = e->shape[axis == slice_axis::OUT ? 0 : 1];
    const char *axis_name = axis == slice_axis::OUT ? "rows (out)" : "columns (in)";
    if (begin < 0 || end > extent || begin >= end)
        return Status::invalid_argument(
            fmt::format("tensor {}: TP slice [{}, {}) of its {} {} is empty or out of range", name, begin, end, extent, axis_name));
    // Formats decoded element by element from whole-tensor blocks elsewhere (FP8 blocks, BF16)
    // slice exactly at any cut; the block formats keep their blocks whole.
    const bool blocked = *f == storage_format::NVFP4 || *f == storage_format::EXL3 || *f == storage_format::MXFP4;
    const int align = blocked ? expert_tp_align(w.config(), *f) : 1;
    if (begin % align != 0 || end % align != 0)
        return Status::invalid_argument(fmt::format("tensor {}: TP slice [{}, {}) of its {} {} is not whole {}-channel blocks ({})",
                                                    name, begin, end, extent, axis_name, align, block_reason(*f)));
    return f;
}

}  // namespace

Result<Tensor> expert_slice_f32(const weights &w, const std::string &name, slice_axis axis, int64_t begin, int64_t end) {
    Result<storage_format> f = checked_cut(w, name, axis, begin, end);
    if (!f) return f.status();
    if (*f == storage_format::NVFP4) {
        Result<nvfp4_linear> l = w.nvfp4(name);
        if (!l) return l.status();
        return nvfp4_slice_f32(*l, axis, begin, end);
    }
    if (*f == storage_format::EXL3) {
        Result<exl3_linear> l = w.exl3(name);
        if (!l) return l.status();
        return exl3_slice_f32(*l, axis, begin, end);
    }
    Result<Tensor> t = w.f32(name);
    if (!t) return t.status();
    return cut(*t, axis, begin, end);
}

Result<mxfp4_slice> expert_slice_mxfp4(const weights &w, const std::string &name, slice_axis axis, int64_t begin,
                                       int64_t end) {
    const catalog_entry *e = w.entry(name);
    if (!e) return Status::not_found("tensor " + name + ": not in the catalog");
    Result<storage_format> f = w.format(name);
    if (!f) return f.status();
    if (*f != storage_format::MXFP4) return Status::not_supported("tensor " + name + ": not stored as MXFP4");
    const int64_t out = e->shape[0], in = e->shape[1];
    const int64_t extent = axis == slice_axis::OUT ? out : in;
    if (begin < 0 || end > extent || begin >= end || begin % 32 != 0 || (end % 32 != 0 && end != extent))
        return Status::invalid_argument(fmt::format("tensor {}: TP slice [{}, {}) is not whole 32-channel blocks of {} ({})",
                                                    name, begin, end, extent, block_reason(*f)));
    const std::string base = name.substr(0, name.size() - std::string("weight").size());
    Result<Tensor> codes = w.raw(name), scales = w.raw(base + "scale");
    if (!codes) return codes.status();
    if (!scales) return scales.status();
    const uint8_t *c = codes->data<uint8_t>(), *sc = scales->data<uint8_t>();
    const int64_t cb = in / 2, sb = (in + 31) / 32;
    mxfp4_slice s;
    if (axis == slice_axis::OUT) {
        s.out = end - begin;
        s.in = in;
        s.codes.assign(c + begin * cb, c + end * cb);
        s.scales.assign(sc + begin * sb, sc + end * sb);
        return s;
    }
    s.out = out;
    s.in = end - begin;
    const int64_t scb = s.in / 2, ssb = (s.in + 31) / 32;
    s.codes.resize(size_t(out * scb));
    s.scales.resize(size_t(out * ssb));
    for (int64_t r = 0; r < out; r++) {
        std::copy(c + r * cb + begin / 2, c + r * cb + begin / 2 + scb, s.codes.data() + r * scb);
        std::copy(sc + r * sb + begin / 32, sc + r * sb + begin / 32 + ssb, s.scales.data() + r * ssb);
    }
    return s;
}

Result<nvfp4_slice> expert_slice_nvfp4(const weights &w, const std::string &name, slice_axis axis, int64_t begin,
                                       int64_t end) {
    Result<storage_format> f = checked_cut(w, name, axis, begin, end);
    if (!f) return f.status();
    if (*f != storage_format::NVFP4) return Status::not_supported("tensor " + name + ": not stored as NVFP4");
    Result<nvfp4_linear> l = w.nvfp4(name);
    if (!l) return l.status();
    nvfp4_slice s;
    const nvfp4_linear c = nvfp4_cut(*l, axis, begin, end, &s.codes, &s.scales);
    s.out = c.out;
    s.in = c.in;
    s.weight_scale_2 = c.weight_scale_2;
    s.input_scale = c.input_scale;
    return s;
}

Result<exl3_slice> expert_slice_exl3(const weights &w, const std::string &name, slice_axis axis, int64_t begin,
                                     int64_t end) {
    Result<storage_format> f = checked_cut(w, name, axis, begin, end);
    if (!f) return f.status();
    if (*f != storage_format::EXL3) return Status::not_supported("tensor " + name + ": not stored as EXL3");
    Result<exl3_linear> l = w.exl3(name);
    if (!l) return l.status();
    exl3_slice s;
    const exl3_linear c = exl3_cut(*l, axis, begin, end, &s.trellis, &s.suh, &s.svh);
    s.in = c.in;
    s.out = c.out;
    s.k = c.k;
    s.cb = c.cb;
    return s;
}

}  // namespace ds41rt::model
