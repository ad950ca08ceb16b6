// A cheap 64-bit digest (FNV-1a) for names and fingerprints that must be stable across builds and machines: the
// token cache's file name and key, a tokenizer's fingerprint, the training data's digest a checkpoint records.
// Not a cryptographic hash: it tells apart contents that changed, not contents made to collide.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

namespace ht {

class Fnv1a {
 public:
  Fnv1a& add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 0x100000001b3ull;
    return *this;
  }
  Fnv1a& add(std::string_view s) { return add(s.data(), s.size()); }
  // A value's bytes as this machine lays them out (every supported host is little-endian).
  template <class T>
    requires std::is_trivially_copyable_v<T>
  Fnv1a& add_value(const T& v) {
    return add(&v, sizeof v);
  }
  // A vector's length, then its elements' bytes: [a, b] + [c] and [a] + [b, c] digest differently.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  Fnv1a& add_values(const std::vector<T>& v) {
    add_value(static_cast<uint64_t>(v.size()));
    return add(v.data(), v.size() * sizeof(T));
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// CRC-32 (zlib's, the one PNG and gzip use) of `n` bytes continued from `crc` (0 to start), for any n: the token
// cache's payload check and the source files a converted checkpoint records.
uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n);

}  // namespace ht
