// CRC-32 through zlib, and SHA-256 as FIPS 180-4 defines it (core/digest.h).
#include "hadatrain/core/digest.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <zlib.h>

#include "hadatrain/core/error.h"

namespace ht {

uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n) {
  auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib takes at most a uInt of bytes a call
    const auto k = static_cast<uInt>(std::min<std::size_t>(n, std::size_t{1} << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, k));
    p += k;
    n -= k;
  }
  return crc;
}

namespace {

// K(0..63), section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr std::array<uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// The functions of section 4.1.2.
constexpr uint32_t ch(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (~x & z); }
constexpr uint32_t maj(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (x & z) ^ (y & z); }
constexpr uint32_t big_sigma0(uint32_t x) { return std::rotr(x, 2) ^ std::rotr(x, 13) ^ std::rotr(x, 22); }
constexpr uint32_t big_sigma1(uint32_t x) { return std::rotr(x, 6) ^ std::rotr(x, 11) ^ std::rotr(x, 25); }
constexpr uint32_t small_sigma0(uint32_t x) { return std::rotr(x, 7) ^ std::rotr(x, 18) ^ (x >> 3); }
constexpr uint32_t small_sigma1(uint32_t x) { return std::rotr(x, 17) ^ std::rotr(x, 19) ^ (x >> 10); }

uint32_t load_be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

// Section 6.2.2, once per 512-bit block M(i): the message schedule W, the 64 rounds on a..h, then H(i).
void Sha256::compress(const unsigned char* blocks, std::size_t count) {
  std::array<uint32_t, 64> w;
  for (; count > 0; --count, blocks += 64) {
    for (int t = 0; t < 16; ++t) w[t] = load_be32(blocks + 4 * t);
    for (int t = 16; t < 64; ++t) w[t] = small_sigma1(w[t - 2]) + w[t - 7] + small_sigma0(w[t - 15]) + w[t - 16];
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t t1 = h + big_sigma1(e) + ch(e, f, g) + kK[t] + w[t];
      const uint32_t t2 = big_sigma0(a) + maj(a, b, c);
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }
}

Sha256& Sha256::add(const void* data, std::size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  bytes_ += n;
  if (buffered_ > 0) {  // complete the block begun by earlier pieces
    const std::size_t k = std::min(n, block_.size() - buffered_);
    std::memcpy(block_.data() + buffered_, p, k);
    buffered_ += k;
    p += k;
    n -= k;
    if (buffered_ < block_.size()) return *this;
    compress(block_.data(), 1);
    buffered_ = 0;
  }
  compress(p, n / 64);  // whole blocks straight from the caller's bytes
  const std::size_t tail = n % 64;
  if (tail > 0) std::memcpy(block_.data(), p + (n - tail), tail);
  buffered_ = tail;
  return *this;
}

// Section 5.1.1: the message, a 1 bit, zeros up to 448 bits mod 512, then its length in bits as 64 bits, big-endian.
std::array<uint8_t, 32> Sha256::digest() const {
  Sha256 s = *this;
  const uint64_t bits = bytes_ * 8;
  unsigned char pad[72] = {0x80};
  const std::size_t zeros_to = (buffered_ < 56 ? 56 : 120) - buffered_;  // bytes of 0x80 and zeros
  for (int i = 0; i < 8; ++i) pad[zeros_to + i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
  s.add(pad, zeros_to + 8);
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(s.h_[i] >> (24 - 8 * j));
  return out;
}

std::string Sha256::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const uint8_t b : digest()) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

FileSha256 sha256_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "{}: cannot open it to record its SHA-256: {}", path.string(), std::strerror(errno));
  Sha256 h;
  FileSha256 d;
  std::vector<char> block(std::size_t{4} << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    h.add(block.data(), n);
    d.bytes += n;
  }
  HT_CHECK(!in.bad(), "{}: read error while recording its SHA-256", path.string());
  d.sha256 = h.hex();
  return d;
}

}  // namespace ht
