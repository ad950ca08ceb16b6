// IDX files, the format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/): a big-endian
// header (magic 0x0000 08 <ndim>: u8 data with ndim dimensions, then ndim u32 sizes) followed by the
// u8 records. Files may be gzip-compressed or raw (zlib reads both).
//
//   images: magic 0x00000803, sizes (N, rows, cols)  -> tensor (N, 1, rows, cols) u8
//   labels: magic 0x00000801, sizes (N)              -> tensor (N) u8
//
// Truncated or corrupt files throw an ht::Error naming the file and the record where the data ran out.
#pragma once
#include <cstdint>
#include <string>

#include "hadatrain/tensor/tensor.h"

namespace ht::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;

// Reads an images file. `limit` > 0 keeps only the first `limit` records; limit = 0 keeps all. Either way the
// whole file is checked: nothing may follow the last record, a gzip file is decompressed to its end (zlib
// checks its trailer's CRC-32 and length) and a raw file's size must match the header, so a damaged file is
// an error even when the records kept are all there (Note [Limited IDX reads] in idx.cpp).
Tensor read_idx_images(const std::string& path, int64_t limit = 0);  // (N, 1, rows, cols) u8
// Reads a labels file, with the same `limit` rule.
Tensor read_idx_labels(const std::string& path, int64_t limit = 0);  // (N) u8

// The record count N of an images (`images` true) or labels file's header, reading only the header.
int64_t read_idx_count(const std::string& path, bool images);

}  // namespace ht::data
