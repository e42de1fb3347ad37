// Safetensors reader (mmap, validated header) and writer (temp file + rename).
//
// The reader trusts nothing in the file: every field of the JSON header is type-checked, every
// size is computed with overflow checks, and every tensor's byte range is checked against the
// data buffer and against its neighbours before any view is handed out. The mapping is owned by
// keep_, a shared_ptr whose deleter unmaps it, so a Tensor borrowed by get() keeps it alive after
// the file object and the checkpoint are gone.
//
// Deliberately lenient where the data cannot be misread: gaps between tensors and bytes after the
// last one are allowed (the reference reader rejects them), and F4 tensors with an odd element
// count are accepted with ceil(numel / 2) bytes, the last high nibble being padding.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ds41rt::io {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The reference implementation's limit; a larger length means the first 8 bytes are not a header.
constexpr uint64_t MAX_HEADER_BYTES = 100'000'000;
constexpr uint64_t INT64_LIMIT = uint64_t(std::numeric_limits<int64_t>::max());
constexpr const char *METADATA_KEY = "__metadata__";

// strerror is not thread-safe; the generic category's message is.
std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

// A JSON value as text for an error message: never throws (bad UTF-8 is replaced), never huge.
std::string show(const json &v) {
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (s.size() > 48) s = s.substr(0, 45) + "...";
    return s;
}

// A non-negative JSON integer that fits in int64; false for anything else (floats, negatives,
// strings). nlohmann stores non-negative integers as unsigned and negative ones as signed.
bool json_to_u63(const json &v, uint64_t *out) {
    if (v.is_number_unsigned()) {
        *out = v.get<uint64_t>();
        return *out <= INT64_LIMIT;
    }
    if (v.is_number_integer()) {
        int64_t s = v.get<int64_t>();
        *out = uint64_t(s);
        return s >= 0;
    }
    return false;
}

// Parses one header entry and checks it is self-consistent; the data buffer starts at file byte
// data_start. Whether it fits in the file is checked across all entries by the caller.
Result<tensor_info> parse_entry(const std::string &path, const std::string &name, const json &e,
                                uint64_t data_start) {
    auto bad = [&](const std::string &what) {
        return Status::corruption(fmt::format("{}: tensor '{}': {}", path, name, what));
    };
    if (!e.is_object()) return bad(fmt::format("header entry is {}, not an object", show(e)));
    for (const char *field : {"dtype", "shape", "data_offsets"})
        if (!e.contains(field)) return bad(fmt::format("header entry has no \"{}\"", field));

    tensor_info ti;
    ti.name = name;
    ti.file = path;

    const json &dt = e["dtype"];
    if (!dt.is_string()) return bad(fmt::format("\"dtype\" is {}, not a string", show(dt)));
    const std::string &dname = dt.get_ref<const std::string &>();
    if (!dtype_from_name(dname, &ti.type)) return bad(fmt::format("unknown dtype \"{}\"", dname));

    const json &sh = e["shape"];
    if (!sh.is_array()) return bad(fmt::format("\"shape\" is {}, not an array", show(sh)));
    // The element count must fit in int64 (shape_numel's type); a wrapped product would let a huge
    // shape pass the size check against a small byte range.
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < sh.size(); i++) {
        uint64_t d = 0;
        if (!json_to_u63(sh[i], &d)) {
            if (sh[i].is_number_integer() && !sh[i].is_number_unsigned())
                return bad(fmt::format("shape[{}] is negative ({})", i, show(sh[i])));
            return bad(fmt::format("shape[{}] is {}, not a dimension (integer 0..2^63-1)", i,
                                   show(sh[i])));
        }
        ti.shape.push_back(int64_t(d));
        overflow |= __builtin_mul_overflow(numel, d, &numel) || numel > INT64_LIMIT;
    }
    if (overflow) return bad(fmt::format("shape {} has more than 2^63 elements", shape_str(ti.shape)));

    const json &off = e["data_offsets"];
    uint64_t begin = 0, end = 0;
    if (!off.is_array() || off.size() != 2 || !json_to_u63(off[0], &begin) ||
        !json_to_u63(off[1], &end))
        return bad(fmt::format("\"data_offsets\" is {}, not [begin, end] with integers >= 0",
                               show(off)));
    if (begin > end) return bad(fmt::format("data_offsets [{}, {}] begin > end", begin, end));
    uint64_t bits = 0;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_bits(ti.type)), &bits))
        return bad(fmt::format("shape {} of {} is more than 2^64 bits", shape_str(ti.shape), dname));
    uint64_t expect = bits / 8 + (bits % 8 != 0);
    if (end - begin != expect)
        return bad(fmt::format("data_offsets [{}, {}] hold {} bytes, expected {} for {} {}", begin,
                               end, end - begin, expect, dname, shape_str(ti.shape)));

    ti.data_offset = data_start + begin;
    ti.nbytes = expect;
    return ti;
}

Status parse_metadata(const std::string &path, const json &m,
                      std::map<std::string, std::string> *out) {
    if (!m.is_object())
        return Status::corruption(
            fmt::format("{}: \"__metadata__\" is {}, not an object", path, show(m)));
    for (const auto &[k, v] : m.items()) {
        if (!v.is_string())
            return Status::corruption(fmt::format(
                "{}: \"__metadata__\" key '{}' is {}, not a string", path, k, show(v)));
        (*out)[k] = v.get<std::string>();
    }
    return Status::ok();
}

// Writes all of buf or says why not (retries short writes and EINTR).
Status write_all(int fd, const std::string &path, const void *buf, size_t n) {
    const char *p = static_cast<const char *>(buf);
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return Status::io_error(fmt::format("write {}: {}", path, errno_text(errno)));
        p += w;
        n -= size_t(w);
    }
    return Status::ok();
}

Status read_text_file(const std::string &path, std::string *out) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::io_error(fmt::format("open {}: {}", path, errno_text(errno)));
    char buf[65536];
    for (;;) {
        ssize_t r = ::read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            ::close(fd);
            return Status::io_error(fmt::format("read {}: {}", path, errno_text(e)));
        }
        if (r == 0) break;
        out->append(buf, size_t(r));
    }
    ::close(fd);
    return Status::ok();
}

// Shards live in the checkpoint directory; an absolute path or one that climbs out of it is not a
// shard name.
bool is_shard_name(const std::string &s) {
    if (s.empty() || fs::path(s).is_absolute()) return false;
    for (const auto &part : fs::path(s))
        if (part == "..") return false;
    return true;
}

bool is_plain_file(const fs::path &p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec);
}

}  // namespace

// ---- safetensors_file -------------------------------------------------------------------------

safetensors_file::~safetensors_file() = default;

Result<std::shared_ptr<safetensors_file>> safetensors_file::open(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        std::string msg = fmt::format("open {}: {}", path, errno_text(e));
        return e == ENOENT ? Status::not_found(msg) : Status::io_error(msg);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        return Status::io_error(fmt::format("stat {}: {}", path, errno_text(e)));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        return Status::io_error(fmt::format("open {}: not a regular file", path));
    }
    const uint64_t size = uint64_t(st.st_size);
    if (size < 8) {
        ::close(fd);
        return Status::corruption(fmt::format(
            "{}: file is {} bytes, shorter than the 8-byte header length", path, size));
    }
    void *m = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    ::close(fd);  // the mapping holds its own reference to the file
    if (m == MAP_FAILED)
        return Status::io_error(fmt::format("mmap {} ({} bytes): {}", path, size, errno_text(map_errno)));

    std::shared_ptr<safetensors_file> f(new safetensors_file());
    f->path_ = path;
    f->map_ = static_cast<const uint8_t *>(m);
    f->map_size_ = size_t(size);
    f->keep_ = std::shared_ptr<const void>(m, [size](const void *p) {
        ::munmap(const_cast<void *>(p), size_t(size));
    });

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->map_[i];
    if (n > MAX_HEADER_BYTES)
        return Status::corruption(fmt::format(
            "{}: header length {} bytes is over the {} byte limit (not a safetensors file?)", path,
            n, MAX_HEADER_BYTES));
    if (n > size - 8)
        return Status::corruption(fmt::format(
            "{}: header length {} bytes runs past the end of the file ({} bytes): the file is "
            "truncated by {} bytes",
            path, n, size, 8 + n - size));
    const uint64_t data_start = 8 + n, data_size = size - data_start;

    // nlohmann keeps the last of duplicate keys; catch duplicates while parsing instead, since
    // the discarded entry would be silently unreadable.
    std::string duplicate;
    std::set<std::string> seen;
    json::parser_callback_t note_keys = [&](int depth, json::parse_event_t ev, json &v) {
        if (ev == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
            !seen.insert(v.get<std::string>()).second)
            duplicate = v.get<std::string>();
        return true;
    };
    json header;
    try {
        header = json::parse(f->map_ + 8, f->map_ + data_start, note_keys);
    } catch (const json::exception &e) {
        uint64_t at = 8;
        if (const auto *pe = dynamic_cast<const json::parse_error *>(&e); pe && pe->byte > 0)
            at = 8 + pe->byte - 1;
        return Status::corruption(fmt::format("{}: header (file bytes 8..{}) is not valid JSON near "
                                              "file byte {}: {}",
                                              path, data_start, at, e.what()));
    }
    if (!header.is_object())
        return Status::corruption(
            fmt::format("{}: header is {}, not a JSON object", path, show(header)));
    if (!duplicate.empty())
        return Status::corruption(
            fmt::format("{}: tensor '{}' appears more than once in the header", path, duplicate));

    for (const auto &[name, entry] : header.items()) {
        if (name == METADATA_KEY) {
            DS41RT_RETURN_IF_ERROR(parse_metadata(path, entry, &f->metadata_));
            continue;
        }
        Result<tensor_info> ti = parse_entry(path, name, entry, data_start);
        if (!ti) return ti.status();
        f->tensors_.push_back(std::move(ti).value());
    }

    // Checked against the tensor that reaches furthest, so the message says how much is missing.
    const tensor_info *last = nullptr;
    for (const tensor_info &t : f->tensors_)
        if (!last || t.data_offset + t.nbytes > last->data_offset + last->nbytes) last = &t;
    if (last && last->data_offset + last->nbytes > size) {
        const uint64_t begin = last->data_offset - data_start, end = begin + last->nbytes;
        return Status::corruption(fmt::format(
            "{}: tensor '{}': data_offsets [{}, {}] end past the data buffer ({} bytes from file "
            "byte {}): the file is truncated by {} bytes",
            path, last->name, begin, end, data_size, data_start, end - data_size));
    }

    // File order; then two tensors overlap exactly when one starts before the furthest end seen so
    // far. Empty tensors own no bytes and cannot overlap anything.
    std::sort(f->tensors_.begin(), f->tensors_.end(), [](const tensor_info &a, const tensor_info &b) {
        return a.data_offset != b.data_offset ? a.data_offset < b.data_offset : a.name < b.name;
    });
    const tensor_info *furthest = nullptr;
    for (const tensor_info &t : f->tensors_) {
        if (t.nbytes == 0) continue;
        if (furthest && t.data_offset < furthest->data_offset + furthest->nbytes) {
            auto rel = [&](const tensor_info &x) {
                return fmt::format("'{}' [{}, {}]", x.name, x.data_offset - data_start,
                                   x.data_offset - data_start + x.nbytes);
            };
            return Status::corruption(fmt::format("{}: tensors {} and {} overlap (data_offsets)",
                                                  path, rel(*furthest), rel(t)));
        }
        if (!furthest || t.data_offset + t.nbytes > furthest->data_offset + furthest->nbytes)
            furthest = &t;
    }
    for (size_t i = 0; i < f->tensors_.size(); i++) f->by_name_[f->tensors_[i].name] = i;
    return f;
}

const tensor_info *safetensors_file::find(const std::string &name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Result<Tensor> safetensors_file::get(const std::string &name) const {
    const tensor_info *t = find(name);
    if (!t) return Status::not_found(fmt::format("{}: no tensor '{}'", path_, name));
    return Tensor(t->type, t->shape, map_ + t->data_offset, keep_);
}

// ---- checkpoint -------------------------------------------------------------------------------

Result<checkpoint> checkpoint::open(const std::string &dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        return Status::not_found(fmt::format("checkpoint {}: not a directory", dir));
    checkpoint ck;
    ck.dir_ = dir;
    const fs::path root(dir);

    // Shard file name -> one tensor the index maps to it (for error messages), in name order.
    std::map<std::string, std::string> shards;
    std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard
    const fs::path index_path = root / "model.safetensors.index.json";
    if (is_plain_file(index_path)) {
        std::string text;
        DS41RT_RETURN_IF_ERROR(read_text_file(index_path.string(), &text));
        json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (index.is_discarded() || !index.is_object())
            return Status::corruption(fmt::format("{}: not a JSON object", index_path.string()));
        auto wm = index.find("weight_map");
        if (wm == index.end() || !wm->is_object())
            return Status::corruption(
                fmt::format("{}: no \"weight_map\" object", index_path.string()));
        for (const auto &[tensor, shard] : wm->items()) {
            if (!shard.is_string() || !is_shard_name(shard.get<std::string>()))
                return Status::corruption(fmt::format("{}: weight_map['{}'] is {}, not a shard file name",
                                                      index_path.string(), tensor, show(shard)));
            weight_map.emplace_back(tensor, shard.get<std::string>());
            shards.emplace(shard.get<std::string>(), tensor);
        }
        if (shards.empty())
            return Status::corruption(fmt::format("{}: weight_map is empty", index_path.string()));
    } else if (is_plain_file(root / "model.safetensors")) {
        shards.emplace("model.safetensors", "");
    } else {
        fs::directory_iterator it(root, ec), end;
        for (; !ec && it != end; it.increment(ec))
            if (it->path().extension() == ".safetensors" && is_plain_file(it->path()))
                shards.emplace(it->path().filename().string(), "");
        if (ec) return Status::io_error(fmt::format("list {}: {}", dir, ec.message()));
        if (shards.empty())
            return Status::not_found(fmt::format("checkpoint {}: no .safetensors files", dir));
    }

    std::map<std::string, size_t> file_of_shard;
    for (const auto &[shard, some_tensor] : shards) {
        const std::string p = (root / shard).string();
        Result<std::shared_ptr<safetensors_file>> f = safetensors_file::open(p);
        if (!f && f.status().code() == status_code::NOT_FOUND && !some_tensor.empty())
            return Status::not_found(fmt::format("{}: shard '{}' (holding tensor '{}' per the index) "
                                                 "is missing",
                                                 index_path.string(), shard, some_tensor));
        if (!f) return f.status();
        file_of_shard[shard] = ck.files_.size();
        ck.files_.push_back(std::move(f).value());
    }
    for (size_t fi = 0; fi < ck.files_.size(); fi++) {
        const auto &tensors = ck.files_[fi]->tensors();
        for (size_t ti = 0; ti < tensors.size(); ti++) {
            auto [it, inserted] = ck.index_.emplace(tensors[ti].name, std::make_pair(fi, ti));
            if (!inserted)
                return Status::corruption(fmt::format("checkpoint {}: tensor '{}' is in both {} and {}",
                                                      dir, tensors[ti].name,
                                                      ck.files_[it->second.first]->path(),
                                                      ck.files_[fi]->path()));
        }
    }
    for (const auto &[tensor, shard] : weight_map) {
        if (!ck.files_[file_of_shard[shard]]->find(tensor))
            return Status::corruption(fmt::format("{}: tensor '{}' is mapped to shard '{}' but {} has "
                                                  "no such tensor",
                                                  index_path.string(), tensor, shard,
                                                  ck.files_[file_of_shard[shard]]->path()));
    }
    return ck;
}

const tensor_info *checkpoint::find(const std::string &name) const {
    auto it = index_.find(name);
    if (it == index_.end()) return nullptr;
    return &files_[it->second.first]->tensors()[it->second.second];
}

Result<Tensor> checkpoint::get(const std::string &name) const {
    auto it = index_.find(name);
    if (it == index_.end())
        return Status::not_found(fmt::format("checkpoint {}: no tensor '{}'", dir_, name));
    return files_[it->second.first]->get(name);
}

std::vector<std::string> checkpoint::names() const {
    std::vector<std::string> r;
    r.reserve(index_.size());
    for (const auto &kv : index_) r.push_back(kv.first);
    return r;
}

// ---- writer -----------------------------------------------------------------------------------

Status write_safetensors(const std::string &path,
                         const std::vector<std::pair<std::string, Tensor>> &tensors,
                         const std::map<std::string, std::string> &metadata) {
    // ordered_json keeps __metadata__ first and tensors in data order, as the reference writer
    // does; readers do not depend on it.
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
        auto &m = h[METADATA_KEY];
        for (const auto &[k, v] : metadata) m[k] = v;
    }
    uint64_t offset = 0;
    for (const auto &[name, t] : tensors) {
        if (name == METADATA_KEY || h.contains(name))
            return Status::invalid_argument(
                fmt::format("write {}: tensor name '{}' is reserved or repeated", path, name));
        const uint64_t nb = t.nbytes();
        if (nb > 0 && t.raw() == nullptr)
            return Status::invalid_argument(fmt::format("write {}: tensor '{}' has no data", path, name));
        h[name] = {{"dtype", std::string(dtype_name(t.type()))},
                   {"shape", t.shape()},
                   {"data_offsets", nlohmann::ordered_json::array({offset, offset + nb})}};
        offset += nb;
    }
    std::string header;
    try {
        header = h.dump();
    } catch (const nlohmann::json::exception &e) {
        return Status::invalid_argument(fmt::format("write {}: header not encodable: {}", path, e.what()));
    }
    // Pad so the data buffer starts 8-byte aligned, as the reference writer does.
    header.append((8 - header.size() % 8) % 8, ' ');
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));

    // Written beside the target and renamed over it, so a crash leaves the old file or the new
    // one, never half of one.
    const std::string tmp = path + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::io_error(fmt::format("open {}: {}", tmp, errno_text(errno)));
    Status st = write_all(fd, tmp, len, 8);
    if (st) st = write_all(fd, tmp, header.data(), header.size());
    for (size_t i = 0; st && i < tensors.size(); i++)
        st = write_all(fd, tmp, tensors[i].second.raw(), tensors[i].second.nbytes());
    if (st && ::fsync(fd) != 0) st = Status::io_error(fmt::format("fsync {}: {}", tmp, errno_text(errno)));
    if (::close(fd) != 0 && st) st = Status::io_error(fmt::format("close {}: {}", tmp, errno_text(errno)));
    if (st && ::rename(tmp.c_str(), path.c_str()) != 0)
        st = Status::io_error(fmt::format("rename {} to {}: {}", tmp, path, errno_text(errno)));
    if (!st) ::unlink(tmp.c_str());
    return st;
}

}  // namespace ds41rt::io
