// Digests of bytes. FNV-1a (64 bits) and CRC-32 are cheap checks that tell contents that changed from the ones seen
// before, not contents made to collide: FNV-1a for names and fingerprints that must be stable across builds and
// machines (the token cache's file name and key, a tokenizer's fingerprint, the training data's digest a checkpoint
// records), CRC-32 for the token cache's payload and text files. SHA-256 (FIPS 180-4) is the digest others publish:
// the Hugging Face hub lists each LFS file's SHA-256, so a converted checkpoint records its source files'
// (sha256_file).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
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
// cache's payload check and its text source files'.
uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n);

// Which compression function a Sha256 runs; every one gives the same digest. `fastest` takes the x86 SHA
// extensions where the CPU has them (sha256_sha_ni_available) and the portable C++ one elsewhere (other CPUs,
// non-x86 builds); `portable` and `sha_ni` name one, for tests that compare them and for bench_digest.
enum class Sha256Engine { fastest, portable, sha_ni };

// Whether this build and CPU can run Sha256Engine::sha_ni (x86-64 with the SHA extensions and SSE4.1).
bool sha256_sha_ni_available();

// SHA-256 (FIPS 180-4, section 6.2) of a message fed in pieces of any size, written here from the standard (tested
// against its examples in tests/cpu/test_digest.cpp). The message may be up to 2^61 - 1 bytes (its bit length
// is a 64-bit field of the padding).
//   Sha256 h;
//   h.add(part1).add(part2.data(), part2.size());
//   std::string hex = h.hex();   // 64 lowercase hex digits, as sha256sum and the hub print them
class Sha256 {
 public:
  Sha256();  // Sha256Engine::fastest
  // Throws when `engine` is sha_ni and !sha256_sha_ni_available().
  explicit Sha256(Sha256Engine engine);

  Sha256& add(const void* data, std::size_t n);
  Sha256& add(std::string_view s) { return add(s.data(), s.size()); }
  // The digest of the bytes added so far. The object is unchanged: more bytes may follow, for a longer message.
  std::array<uint8_t, 32> digest() const;
  std::string hex() const;

 private:
  // H(i-1) -> H(i) over `count` whole 64-byte blocks (src/core/sha256_compress.h).
  using Compress = void (*)(std::array<uint32_t, 8>& h, const unsigned char* blocks, std::size_t count);

  Compress compress_;
  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};  // H(0), section 5.3.3
  std::array<unsigned char, 64> block_{};  // the message's bytes past the last whole block
  std::size_t buffered_ = 0;               // how many of them
  uint64_t bytes_ = 0;                     // the message's length so far
};

// A file's size and SHA-256 (hex), read in blocks (a weight shard may be several GB). Errors name the file.
struct FileSha256 {
  uint64_t bytes = 0;
  std::string sha256;
};
FileSha256 sha256_file(const std::filesystem::path& path);

}  // namespace ht
