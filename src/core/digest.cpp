// CRC-32 through zlib, and SHA-256 as FIPS 180-4 defines it (core/digest.h): the padding, the pieces and the
// portable compression function here, the one on the x86 SHA extensions in sha256_sha_ni.cpp.
#include "hadatrain/core/digest.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <zlib.h>

#include "core/sha256_compress.h"
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

namespace detail {

// Section 6.2.2, once per 512-bit block M(i): the message schedule W, the 64 rounds on a..h, then H(i).
void sha256_compress_portable(std::array<uint32_t, 8>& hv, const unsigned char* blocks, std::size_t count) {
  std::array<uint32_t, 64> w;
  for (; count > 0; --count, blocks += 64) {
    for (int t = 0; t < 16; ++t) w[t] = load_be32(blocks + 4 * t);
    for (int t = 16; t < 64; ++t) w[t] = small_sigma1(w[t - 2]) + w[t - 7] + small_sigma0(w[t - 15]) + w[t - 16];
    uint32_t a = hv[0], b = hv[1], c = hv[2], d = hv[3], e = hv[4], f = hv[5], g = hv[6], h = hv[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t t1 = h + big_sigma1(e) + ch(e, f, g) + kSha256K[t] + w[t];
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
    hv[0] += a, hv[1] += b, hv[2] += c, hv[3] += d, hv[4] += e, hv[5] += f, hv[6] += g, hv[7] += h;
  }
}

}  // namespace detail

bool sha256_sha_ni_available() {
#if defined(__x86_64__)
  static const bool has = detail::cpu_has_sha_ni();
  return has;
#else
  return false;
#endif
}

Sha256::Sha256() : Sha256(Sha256Engine::fastest) {}

Sha256::Sha256(Sha256Engine engine) : compress_(detail::sha256_compress_portable) {
  HT_CHECK(engine != Sha256Engine::sha_ni || sha256_sha_ni_available(),
           "SHA-256 on the x86 SHA extensions was asked for, but this CPU or build has none; ask for "
           "Sha256Engine::fastest (or portable), which runs everywhere");
#if defined(__x86_64__)
  if (engine != Sha256Engine::portable && sha256_sha_ni_available()) compress_ = detail::sha256_compress_sha_ni;
#endif
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
    compress_(h_, block_.data(), 1);
    buffered_ = 0;
  }
  compress_(h_, p, n / 64);  // whole blocks straight from the caller's bytes
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
