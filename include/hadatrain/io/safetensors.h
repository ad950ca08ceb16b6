// safetensors files (the format of HF/PyTorch `safetensors`): save named tensors atomically, load them back
// with full validation, and load HF sharded checkpoints through model.safetensors.index.json.
// File layout: [u64 little-endian N][N bytes JSON header][data]; see docs/checkpoints.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hadatrain/tensor/tensor.h"

namespace ht::io {

using TensorList = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// The safetensors dtype string of a hadatrain dtype ("F32", "BF16", "F8_E4M3", "BOOL", ...). Packed int4
// has no safetensors dtype: this throws, telling the caller to store the packed bytes as U8 explicitly.
std::string_view safetensors_dtype(DType dt);
// The hadatrain dtype of a safetensors dtype string, or nullopt when hadatrain has no such dtype
// (I16, U16, U32, U64, F8_E8M0, ...) or the string is not a safetensors dtype at all.
std::optional<DType> dtype_from_safetensors(std::string_view name);

// Writes `tensors` (any device, any layout: copied to host, contiguous, little-endian C order) and the
// string metadata (`__metadata__`, omitted when empty) to `path`, atomically (Note [Atomic file
// replacement]). Names must be unique, non-empty and not "__metadata__". Data is laid out by decreasing
// itemsize, then name (as the Python writer does), so every tensor starts at an offset aligned to its
// element size; the header is padded with spaces to a multiple of 8 bytes.
void save_safetensors(const std::filesystem::path& path, const TensorList& tensors, const Metadata& metadata = {});

// What one header entry says about a tensor.
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section, end exclusive
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // by data offset
  Metadata metadata;
  uint64_t data_start = 0;  // file offset of the data section (8 + header length)
};

struct SafetensorsContents {
  std::map<std::string, Tensor> tensors;  // CPU, contiguous, sorted by name
  Metadata metadata;

  // The tensor called `name`; throws ht::Error listing a few available names when absent.
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
};

// Reads and validates the header only (cheap: no tensor data is read). Every problem throws ht::Error naming
// the file and, where one is involved, the tensor: file too small, header length beyond the file or above
// 100 MB, header not a JSON object, duplicate names, unknown or unsupported dtype, bad shape, data_offsets out
// of range / overlapping / leaving gaps / not matching numel * itemsize, trailing bytes after the last tensor.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);
// Reads the whole file (header validated as above) into CPU tensors.
SafetensorsContents load_safetensors(const std::filesystem::path& path);

// Loads an HF sharded checkpoint: `path` is model.safetensors.index.json or the directory holding it
// ({"metadata": {...}, "weight_map": {"<tensor>": "<shard file>", ...}}). A directory without an index but with
// a single model.safetensors loads that file. Each shard is read once; only the tensors named in weight_map are
// returned. Errors (naming the index and the shard): missing shard files, shard names that are absolute or leave
// the directory, tensors mapped to a shard that lacks them. The returned metadata is the index's "metadata"
// object (non-string values as their JSON text, e.g. total_size).
SafetensorsContents load_sharded_safetensors(const std::filesystem::path& dir_or_index_path);

}  // namespace ht::io
