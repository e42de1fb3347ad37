// Safetensors files: read (mmap, single file or sharded by model.safetensors.index.json) and write.
//
// What crosses this boundary: tensor names, dtypes, shapes and borrowed host views into the mapped
// files. A Tensor returned by get() keeps its file mapped for as long as it lives. Nothing here
// knows what a tensor means; model/ does.
//
// Every malformed input is a Status naming the file and, where there is one, the tensor and the
// byte offset: a truncated file, a header whose offsets or shapes disagree with the data, an
// unknown dtype, overlapping or out-of-range data, a shard the index names that is missing.
// Nothing here aborts on bad input.
//
// Thread safety: a file or checkpoint is immutable after open(); any thread may call its const
// methods.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace ds41rt::io {

struct tensor_info {
    std::string name;
    dtype type = dtype::F32;
    shape_t shape;
    std::string file;         // path of the file that holds it
    uint64_t data_offset = 0;  // absolute byte offset of the first data byte in that file
    uint64_t nbytes = 0;
};

class safetensors_file {
public:
    // Maps the file and validates its header against the file size.
    static Result<std::shared_ptr<safetensors_file>> open(const std::string &path);
    ~safetensors_file();

    const std::string &path() const { return path_; }
    const std::vector<tensor_info> &tensors() const { return tensors_; }
    const std::map<std::string, std::string> &metadata() const { return metadata_; }
    const tensor_info *find(const std::string &name) const;
    // A borrowed view of the named tensor; NOT_FOUND if absent.
    Result<Tensor> get(const std::string &name) const;

private:
    safetensors_file() = default;
    std::string path_;
    std::vector<tensor_info> tensors_;
    std::map<std::string, size_t> by_name_;
    std::map<std::string, std::string> metadata_;
    const uint8_t *map_ = nullptr;
    size_t map_size_ = 0;
    std::shared_ptr<const void> keep_;  // owns the mapping; tensors hold copies of it
};

// A checkpoint directory: model.safetensors.index.json (sharded), or a single model.safetensors,
// or, failing both, every *.safetensors file in the directory. Names must be unique across files.
class checkpoint {
public:
    static Result<checkpoint> open(const std::string &dir);

    const std::string &dir() const { return dir_; }
    bool has(const std::string &name) const { return index_.count(name) != 0; }
    const tensor_info *find(const std::string &name) const;
    Result<Tensor> get(const std::string &name) const;
    std::vector<std::string> names() const;  // sorted
    size_t size() const { return index_.size(); }

private:
    std::string dir_;
    std::vector<std::shared_ptr<safetensors_file>> files_;
    std::map<std::string, std::pair<size_t, size_t>> index_;  // name -> (file, tensor)
};

// Writes tensors (in the given order, data packed in that order) with optional __metadata__.
Status write_safetensors(const std::string &path,
                         const std::vector<std::pair<std::string, Tensor>> &tensors,
                         const std::map<std::string, std::string> &metadata = {});

}  // namespace ds41rt::io
