#include "engine/cuda/paged_rows.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;

namespace {
// n fp32 values into rows of fp32 records, on the model's stream.
Status copy_f32(const device_model &m, uint8_t *dst, const float *src, int64_t n) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, m.stream()));
    return Status::ok();
}
}  // namespace

Status paged_rows::append(const device_model &m, int64_t n, const writer &write) {
    if (n <= 0) return Status::ok();
    if (!pool_ || pitch_ <= 0 || page_rows_ <= 0) return Status::internal("paged_rows: append to a store with no pool");
    const size_t need = size_t((rows_ + n + page_rows_ - 1) / page_rows_);
    while (pages_.size() < need) {
        Result<uint8_t *> p = pool_->take(pitch_ * page_rows_);
        if (!p) return p.status();
        pages_.emplace_back(pool_, *p, pitch_ * page_rows_);
        htable_.push_back(*p);
    }
    if (uploaded_ < htable_.size()) {  // a new table: kernels queued before read the old one, freed after them
        dtemp t = m.temp(htable_.size() * sizeof(const uint8_t *));
        DS41RT_RETURN_IF_ERROR(m.to_device(t.as<void>(), htable_.data(), htable_.size() * sizeof(const uint8_t *)));
        dtable_ = std::move(t);
        uploaded_ = htable_.size();
    }
    for (int64_t r = rows_; r < rows_ + n;) {
        const int64_t count = std::min(page_rows_ - r % page_rows_, rows_ + n - r);
        DS41RT_RETURN_IF_ERROR(write(r - rows_, count, row(r)));
        r += count;
    }
    rows_ += n;
    return Status::ok();
}

key_store::key_store(page_pool *pool, int64_t width, cuda::key_format fmt, int64_t page_rows)
    : rows(pool, cuda::key_record_bytes(fmt, width), page_rows), width(width), fmt(fmt) {}

cuda::key_rows_ref key_store::ref() const {
    return {nullptr, rows.pitch(), fmt, rows.device_table(), rows.page_rows()};
}

cuda::key_rows_ref key_store::host_ref() const { return {nullptr, rows.pitch(), fmt, rows.host_table(), rows.page_rows()}; }

Status key_store::append(const device_model &m, const float *src, int64_t n) {
    return rows.append(m, n, [&](int64_t first, int64_t count, uint8_t *dst) -> Status {
        const float *x = src + first * width;
        switch (fmt) {
        case cuda::key_format::F32:
            return copy_f32(m, dst, x, count * width);
        case cuda::key_format::FP8_UE8M0_32:
            return cuda::pack_fp8_ue8m0(x, count, width, width, 32, cuda::fp8_records(dst, width), m.stream());
        case cuda::key_format::FP4_E4M3_16:
            return cuda::pack_fp4_e4m3(x, count, width, 16, cuda::fp4_records(dst, width), m.stream());
        case cuda::key_format::FP8_UE8M0_64_BF16_TAIL:
            return cuda::pack_fp8_ue8m0(x, count, width, width - cuda::KEY_BF16_TAIL, 64, cuda::fp8_tail_records(dst, width),
                                        m.stream());
        }
        return Status::internal("key_store: unknown format");
    });
}

namespace {
// An FP4 + E8M0 per 32 key: codes then scales, 4-byte aligned (the indexer reads codes by words).
int64_t index_key_bytes(int64_t width, bool fp4) { return fp4 ? (width / 2 + width / 32 + 3) / 4 * 4 : 4 * width; }
}  // namespace

index_key_store::index_key_store(page_pool *pool, int64_t width, bool fp4, int64_t page_rows)
    : rows(pool, index_key_bytes(width, fp4), page_rows), width(width), fp4(fp4) {}

cuda::index_keys index_key_store::keys() const {
    return cuda::index_keys::paged(rows.device_table(), rows.page_rows(), rows.pitch(), fp4);
}

Status index_key_store::append(const device_model &m, const float *src, int64_t n) {
    return rows.append(m, n, [&](int64_t first, int64_t count, uint8_t *dst) -> Status {
        const float *x = src + first * width;
        if (!fp4) return copy_f32(m, dst, x, count * width);
        return cuda::pack_fp4_ue8m0(x, count, width, 32, {dst, dst + width / 2, rows.pitch()}, m.stream());
    });
}

}  // namespace ds41rt::engine::gpu
