// Tensor: a typed, shaped block of host memory, owned or borrowed.
//
// Row-major, contiguous. Storage is shared (std::shared_ptr) so a tensor borrowed from a mapped
// checkpoint keeps the mapping alive, and copies are cheap handles, not deep copies. For
// F4_E2M1 the shape counts elements and the storage holds two per byte.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace ds41rt {

using shape_t = std::vector<int64_t>;

int64_t shape_numel(const shape_t &s);
std::string shape_str(const shape_t &s);  // "[2, 3]"

class Tensor {
public:
    Tensor() = default;
    // Allocates zeroed storage.
    Tensor(dtype t, shape_t shape);
    // Borrows data; keepalive holds whatever owns it.
    Tensor(dtype t, shape_t shape, const void *data, std::shared_ptr<const void> keepalive);

    static Tensor f32(shape_t shape) { return Tensor(dtype::F32, std::move(shape)); }
    static Tensor f32(shape_t shape, std::initializer_list<float> values);

    dtype type() const { return type_; }
    const shape_t &shape() const { return shape_; }
    int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
    int rank() const { return int(shape_.size()); }
    int64_t numel() const { return shape_numel(shape_); }
    size_t nbytes() const { return dtype_bytes(type_, size_t(numel())); }
    bool empty() const { return data_ == nullptr; }

    const void *raw() const { return data_; }
    // Writable only for tensors this process allocated.
    void *raw_mut() const { DS41RT_ASSERT(owned_); return const_cast<void *>(data_); }
    template <typename T> const T *data() const { return static_cast<const T *>(data_); }
    template <typename T> T *data_mut() const { return static_cast<T *>(raw_mut()); }
    float *f() const { DS41RT_ASSERT(type_ == dtype::F32); return data_mut<float>(); }

    // Same storage, new shape with the same element count.
    Tensor reshape(shape_t shape) const;
    // A deep copy converted to fp32 (exact for every floating type here).
    Tensor to_f32() const;
    Tensor clone() const;

private:
    dtype type_ = dtype::F32;
    shape_t shape_;
    const void *data_ = nullptr;
    bool owned_ = false;
    std::shared_ptr<const void> keep_;
};

}  // namespace ds41rt
