#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace ds41rt {

int64_t shape_numel(const shape_t &s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

std::string shape_str(const shape_t &s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); i++) {
        if (i) r += ", ";
        r += std::to_string(s[i]);
    }
    return r + "]";
}

Tensor::Tensor(dtype t, shape_t shape) : type_(t), shape_(std::move(shape)), owned_(true) {
    size_t n = dtype_bytes(t, size_t(shape_numel(shape_)));
    // 64-byte alignment so vector loops and later device copies see aligned rows.
    size_t alloc = (n + 63) / 64 * 64;
    void *p = std::aligned_alloc(64, alloc ? alloc : 64);
    DS41RT_ASSERT_MSG(p != nullptr, "host allocation failed");
    std::memset(p, 0, alloc ? alloc : 64);
    keep_ = std::shared_ptr<const void>(p, [](const void *q) { std::free(const_cast<void *>(q)); });
    data_ = p;
}

Tensor::Tensor(dtype t, shape_t shape, const void *data, std::shared_ptr<const void> keepalive)
    : type_(t), shape_(std::move(shape)), data_(data), owned_(false), keep_(std::move(keepalive)) {}

Tensor Tensor::f32(shape_t shape, std::initializer_list<float> values) {
    Tensor t(dtype::F32, std::move(shape));
    DS41RT_ASSERT(int64_t(values.size()) == t.numel());
    std::memcpy(t.raw_mut(), values.begin(), values.size() * 4);
    return t;
}

Tensor Tensor::reshape(shape_t shape) const {
    DS41RT_ASSERT(shape_numel(shape) == numel());
    Tensor r = *this;
    r.shape_ = std::move(shape);
    return r;
}

Tensor Tensor::to_f32() const {
    Tensor r(dtype::F32, shape_);
    ds41rt::to_f32(type_, data_, r.f(), size_t(numel()));
    return r;
}

Tensor Tensor::clone() const {
    Tensor r(type_, shape_);
    std::memcpy(r.raw_mut(), data_, nbytes());
    return r;
}

}  // namespace ds41rt
