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

// Reads an images file. `limit` > 0 reads only the first `limit` records (the rest is not decompressed);
// limit = 0 reads all and checks that nothing follows the last record.
Tensor read_idx_images(const std::string& path, int64_t limit = 0);  // (N, 1, rows, cols) u8
// Reads a labels file, with the same `limit` rule.
Tensor read_idx_labels(const std::string& path, int64_t limit = 0);  // (N) u8
// With limit < N the file's size is still checked against the header (a raw file's size, a gzip file's
// recorded uncompressed size), so a truncated file is an error even when the records read are all there.

// The record count N of an images (`images` true) or labels file's header, reading only the header.
int64_t read_idx_count(const std::string& path, bool images);

}  // namespace ht::data
