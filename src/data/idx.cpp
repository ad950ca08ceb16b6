// IDX reader (MNIST / Fashion-MNIST files, gzipped or raw): header validation, record reading with errors that
// name the file and the record where the data ran out, and the whole-file check behind a limited read.
#include "hadatrain/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "hadatrain/core/error.h"

namespace ht::data {
namespace {

// A gzFile that closes itself. gzread passes raw (uncompressed) files through unchanged.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    f_ = gzopen(path.c_str(), "rb");
    HT_CHECK(f_ != nullptr, "{}: cannot open IDX file: {}", path,
             errno ? std::strerror(errno) : "out of memory");
    gzbuffer(f_, 1 << 18);
  }
  ~GzReader() { gzclose(f_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes; returns how many were read (fewer only at the end of the data). `what` names the
  // records being read, for the message if the compressed stream is corrupt. zlib checks the gzip trailer (the
  // CRC-32 and length of the data) when a read reaches the end of the stream.
  std::size_t read(void* dst, std::size_t n, const std::string& what) {
    std::size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int got = gzread(f_, static_cast<char*>(dst) + done, chunk);
      if (got < 0) fail(what);
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

  // True for gzip data, false for a raw file (read through unchanged); valid after the first read.
  bool compressed() { return gzdirect(f_) == 0; }

  // True when the reads stopped because the compressed data ended before the gzip trailer did (zlib's
  // "unexpected end of file", which gzread reports as the end of the data, not as an error).
  bool cut_short() {
    int errnum = Z_OK;
    gzerror(f_, &errnum);
    return errnum == Z_BUF_ERROR;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    int errnum = Z_OK;
    const char* text = gzerror(f_, &errnum);
    std::string msg = text != nullptr ? text : "read error";
    if (msg.rfind(path_ + ": ", 0) == 0) msg.erase(0, path_.size() + 2);  // zlib puts the path first
    HT_CHECK(errnum != Z_DATA_ERROR,
             "{}: the gzip data is damaged (zlib: {}{}), found while decompressing {}; the file is corrupt: fetch "
             "or copy it again",
             path_, msg,
             msg == "incorrect data check"     ? ": the CRC-32 in the gzip trailer does not match the data"
             : msg == "incorrect length check" ? ": the length in the gzip trailer does not match the data"
                                               : "",
             what);
    HT_FAIL("{}: cannot read {}: {}", path_, what, msg);
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

uint32_t big_endian_u32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct IdxHeader {
  std::vector<int64_t> sizes;  // N first
};

IdxHeader read_header(GzReader& in, const std::string& path, uint32_t magic, int ndim, const char* kind) {
  std::array<unsigned char, 4> word{};
  const std::size_t got = in.read(word.data(), 4, "the header");
  HT_CHECK(got == 4, "{}: truncated IDX file: {} bytes, too short for the 4-byte magic number", path, got);
  const uint32_t found = big_endian_u32(word.data());
  if (found != magic) {
    std::string hint;
    if (found == kIdxImagesMagic) hint = " (this is an IDX images file)";
    if (found == kIdxLabelsMagic) hint = " (this is an IDX labels file)";
    if ((found >> 16) == 0x1f8b) hint = " (gzip data that did not decompress: is the file damaged?)";
    HT_FAIL("{}: bad magic number 0x{:08x}{}: expected 0x{:08x} for IDX {} (u8 data, {} dimension{})", path, found,
            hint, magic, kind, ndim, ndim == 1 ? "" : "s");
  }
  IdxHeader h;
  for (int d = 0; d < ndim; ++d) {
    HT_CHECK(in.read(word.data(), 4, "the header") == 4,
             "{}: truncated IDX file: the header ends before size {} of {}", path, d + 1, ndim);
    h.sizes.push_back(big_endian_u32(word.data()));
  }
  return h;
}

// Reads records [begin, end) of `record_bytes` each into dst; a short read names the record it stopped in. With
// dst null the records are read and dropped (to find where a file that cannot hold them ends, or to check the
// rest of a gzip stream).
void read_records(GzReader& in, const std::string& path, uint8_t* dst, int64_t begin, int64_t end, int64_t total,
                  int64_t record_bytes, const char* record_name) {
  // Read in blocks of whole records so a decompression error can name the record it happened in.
  const int64_t per_block = std::max<int64_t>(1, (int64_t{1} << 20) / record_bytes);
  std::vector<uint8_t> scratch;
  if (dst == nullptr) scratch.resize(static_cast<std::size_t>(std::min(end - begin, per_block) * record_bytes));
  for (int64_t first = begin; first < end; first += per_block) {
    const int64_t n = std::min(per_block, end - first);
    const std::size_t want = static_cast<std::size_t>(n * record_bytes);
    uint8_t* into = dst != nullptr ? dst + (first - begin) * record_bytes : scratch.data();
    const std::size_t got = in.read(into, want, fmt::format("{}s {}..{}", record_name, first, first + n - 1));
    if (got < want) {
      const int64_t index = first + static_cast<int64_t>(got) / record_bytes;
      HT_FAIL("{}: truncated IDX file: the header announces {} {}s but the data ends in {} {} (0-based), "
              "after {} of {} data bytes; the file is incomplete or damaged",
              path, total, record_name, record_name, index, first * record_bytes + static_cast<int64_t>(got),
              total * record_bytes);
    }
  }
}

// Reads to the end of the data: nothing may follow the records, and a gzip stream must end with its whole
// trailer (whose CRC-32 and length zlib checks on the way).
void check_no_trailing_data(GzReader& in, const std::string& path, int64_t total, const char* record_name) {
  unsigned char extra = 0;
  HT_CHECK(in.read(&extra, 1, "the end of the file") == 0,
           "{}: unexpected data after the {} {}s announced by the header; the file is damaged or not IDX", path,
           total, record_name);
  HT_CHECK(!in.cut_short(),
           "{}: the gzip stream ends before its trailer (CRC-32 and length) after the {} {}s: the file is truncated",
           path, total, record_name);
}

int64_t records_to_read(int64_t total, int64_t limit) { return limit > 0 ? std::min(total, limit) : total; }

// The most data bytes the file can hold after its header: a raw file its size, a gzip file at most 1032 times
// its compressed size (deflate's largest expansion) plus a little for the gzip framing.
int64_t max_data_bytes(const std::string& path, int64_t header_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  HT_CHECK(f != nullptr, "{}: cannot open IDX file: {}", path, std::strerror(errno));
  unsigned char head[2] = {0, 0};
  const bool gzip = std::fread(head, 1, 2, f) == 2 && head[0] == 0x1f && head[1] == 0x8b;
  std::fseek(f, 0, SEEK_END);
  const int64_t size = std::ftell(f);
  std::fclose(f);
  return gzip ? size * 1032 + 1024 : size - header_bytes;
}

// Reads `count` records into a new (count, shape...) u8 tensor. A header that announces more data than the file
// can hold is found before the tensor is allocated: the data is read and dropped to name where it ends.
Tensor read_record_tensor(GzReader& in, const std::string& path, const Shape& shape, int64_t total, int64_t record_bytes,
                          int header_words, const char* record_name) {
  const int64_t count = shape[0];
  if (count > 0 && count * record_bytes > max_data_bytes(path, 4 + 4 * int64_t{header_words})) {
    read_records(in, path, nullptr, 0, count, total, record_bytes, record_name);
    HT_FAIL("{}: the header announces {} {}s, more than the file can hold", path, total, record_name);
  }
  Tensor t = empty(shape, {DType::u8});
  if (count > 0) read_records(in, path, t.data<uint8_t>(), 0, count, total, record_bytes, record_name);
  return t;
}

// Note [Limited IDX reads]
// A limited read (limit < N) keeps only the first records, but it must not accept a damaged file: the records
// past the limit are what a later run without the limit reads, and a limited run is how a recipe is tried out
// before the full run. So the whole file is checked either way. A gzip file is decompressed to its end (the
// records past the limit are read and dropped): zlib then checks the trailer's CRC-32 and length, so a
// truncated file, a flipped byte anywhere in the stream and data beyond the N records are all errors (for
// Fashion-MNIST's train images this costs about 0.2 s). A raw file has no checksum; its size must be the header
// plus N records exactly, which is checked without reading the data.
void check_raw_size(const std::string& path, int ndim, int64_t total, int64_t record_bytes, const char* record_name) {
  const int64_t expected = 4 + 4 * int64_t{ndim} + total * record_bytes;
  std::error_code ec;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  HT_CHECK(!ec, "{}: cannot read the IDX file's size: {}", path, ec.message());
  HT_CHECK(size == expected,
           "{}: the file holds {} bytes, but its header announces {} {}s ({} bytes with the header): the file is "
           "{}; data.train_limit / test_limit read only the first records but do not accept a damaged file",
           path, size, total, record_name, expected, size < expected ? "truncated" : "longer than announced");
}

// Reads the records of a file of `total` past the `count` already read (Note [Limited IDX reads]) and checks
// that nothing follows them.
void check_rest(GzReader& in, const std::string& path, int ndim, int64_t count, int64_t total, int64_t record_bytes,
                const char* record_name) {
  if (count < total && !in.compressed()) return check_raw_size(path, ndim, total, record_bytes, record_name);
  if (count < total) read_records(in, path, nullptr, count, total, total, record_bytes, record_name);
  check_no_trailing_data(in, path, total, record_name);
}

}  // namespace

Tensor read_idx_images(const std::string& path, int64_t limit) {
  HT_CHECK(limit >= 0, "read_idx_images: limit must be >= 0, got {}", limit);
  GzReader in(path);
  const IdxHeader h = read_header(in, path, kIdxImagesMagic, 3, "images");
  const int64_t n = h.sizes[0], rows = h.sizes[1], cols = h.sizes[2];
  HT_CHECK(rows > 0 && cols > 0 && rows <= 4096 && cols <= 4096,
           "{}: implausible image size {}x{} in the IDX header (expected 1..4096 pixels per side)", path, rows, cols);
  const int64_t count = records_to_read(n, limit);
  Tensor images = read_record_tensor(in, path, {count, 1, rows, cols}, n, rows * cols, 3, "image");
  check_rest(in, path, 3, count, n, rows * cols, "image");
  return images;
}

Tensor read_idx_labels(const std::string& path, int64_t limit) {
  HT_CHECK(limit >= 0, "read_idx_labels: limit must be >= 0, got {}", limit);
  GzReader in(path);
  const IdxHeader h = read_header(in, path, kIdxLabelsMagic, 1, "labels");
  const int64_t n = h.sizes[0];
  const int64_t count = records_to_read(n, limit);
  Tensor labels = read_record_tensor(in, path, {count}, n, 1, 1, "label");
  check_rest(in, path, 1, count, n, 1, "label");
  return labels;
}

int64_t read_idx_count(const std::string& path, bool images) {
  GzReader in(path);
  const IdxHeader h = images ? read_header(in, path, kIdxImagesMagic, 3, "images")
                             : read_header(in, path, kIdxLabelsMagic, 1, "labels");
  return h.sizes[0];
}

}  // namespace ht::data
