// SHA-256 (core/digest.h) against the examples of FIPS 180-4 (NIST's "SHA-256 examples": the empty message, "abc",
// the 448-bit and 896-bit messages, one million 'a'), against digests by another implementation (Python's hashlib)
// of the messages whose padding falls at a block's edge, and fed in pieces of awkward sizes, which must give the
// digest of the whole. Each runs on every compression function this machine has (the portable one, and the one on
// the x86 SHA extensions where the CPU has them), and the two agree bit for bit on random messages of awkward
// lengths fed in awkward pieces. sha256_file reads a file in blocks: its digest is the file's, across a block
// boundary.
#include "support/catch.h"
#include "support/testing.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "hadatrain/core/digest.h"

using namespace ht;
namespace fs = std::filesystem;

namespace {

// The compression functions this machine runs: the portable one, and the SHA extensions' where the CPU has them.
std::vector<Sha256Engine> engines() {
  if (sha256_sha_ni_available()) return {Sha256Engine::portable, Sha256Engine::sha_ni};
  WARN("this CPU (or a non-x86 build) has no SHA extensions: only the portable SHA-256 is tested here");
  return {Sha256Engine::portable};
}

const char* name(Sha256Engine e) { return e == Sha256Engine::sha_ni ? "SHA extensions" : "portable"; }

std::string sha256(std::string_view s, Sha256Engine e = Sha256Engine::fastest) { return Sha256(e).add(s).hex(); }

// `msg` added in pieces whose sizes cycle through `sizes` (0 included: an empty piece changes nothing).
std::string sha256_in_pieces(std::string_view msg, const std::vector<std::size_t>& sizes,
                             Sha256Engine e = Sha256Engine::fastest) {
  Sha256 h(e);
  std::size_t at = 0;
  for (std::size_t i = 0; at < msg.size(); ++i) {
    const std::size_t n = std::min(sizes[i % sizes.size()], msg.size() - at);
    h.add(msg.data() + at, n);
    at += n;
  }
  return h.hex();
}

const std::string k448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
const std::string k896 =
    "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";

}  // namespace

TEST_CASE("SHA-256 of the FIPS 180-4 examples", "[digest]") {
  REQUIRE(k448.size() * 8 == 448);
  REQUIRE(k896.size() * 8 == 896);
  for (const Sha256Engine e : engines()) {
    INFO("compression function: " << name(e));
    CHECK(sha256("", e) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(sha256("abc", e) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(sha256(k448, e) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    CHECK(sha256(k896, e) == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    CHECK(sha256(std::string(1'000'000, 'a'), e) ==
          "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  }
  // The raw digest is the hex's bytes, big-endian words as the standard writes H(N).
  const std::array<uint8_t, 32> d = Sha256().add("abc").digest();
  CHECK(d[0] == 0xba);
  CHECK(d[1] == 0x78);
  CHECK(d[31] == 0xad);
}

TEST_CASE("SHA-256 where the padding meets a block's edge (55 to 128 bytes)", "[digest]") {
  // 55 bytes: the length fits the same block; 56 to 63: the padding spills into a second one; 64: a whole block.
  const std::vector<std::pair<std::size_t, std::string>> cases = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {57, "f13b2d724659eb3bf47f2dd6af1accc87b81f09f59f2b75e5c0bed6589dfe8c6"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {111, "6374f73208854473827f6f6a3f43b1f53eaa3b82c21c1a6d69a2110b2a79baad"},
      {112, "f54353008a2553262ecdc4a34749563ba0950e8b0fc8652780b0a614b99683c1"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
      {127, "c57e9278af78fa3cab38667bef4ce29d783787a2f731d4e12200270f0c32320a"},
      {128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"}};
  for (const Sha256Engine e : engines()) {
    for (const auto& [n, hex] : cases) {
      INFO(n << " bytes of 'a', compression function: " << name(e));
      CHECK(sha256(std::string(n, 'a'), e) == hex);
    }
  }
}

TEST_CASE("SHA-256 fed in pieces of awkward sizes gives the digest of the whole", "[digest]") {
  const std::vector<std::vector<std::size_t>> piece_sizes = {
      {1}, {3}, {7}, {55}, {56}, {63}, {64}, {65}, {127}, {129}, {1000}, {0, 1, 63, 64, 65, 0, 200, 5}, {130, 2, 61}};
  for (const Sha256Engine e : engines()) {
    for (const auto& sizes : piece_sizes) {
      INFO("piece sizes cycling through " << sizes.size() << " value(s), the first " << sizes.front()
                                          << ", compression function: " << name(e));
      CHECK(sha256_in_pieces(k896, sizes, e) == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
      CHECK(sha256_in_pieces(std::string(1'000'000, 'a'), sizes, e) ==
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    }
  }
  // Every length up to three blocks, every split point: one piece, then the rest.
  std::string msg;
  for (int i = 0; i < 192; ++i) msg += static_cast<char>('!' + (i * 37) % 90);
  for (const Sha256Engine e : engines()) {
    for (std::size_t len = 0; len <= msg.size(); ++len) {
      const std::string m = msg.substr(0, len);
      const std::string whole = sha256(m, e);
      for (std::size_t cut = 0; cut <= len; ++cut) {
        Sha256 h(e);
        h.add(m.data(), cut).add(m.data() + cut, len - cut);
        if (h.hex() != whole) FAIL("length " << len << " cut at " << cut << ", compression function: " << name(e));
      }
    }
  }
  // Reading the digest leaves the state as it was: the message may go on.
  Sha256 h;
  h.add("ab");
  CHECK(h.hex() == sha256("ab"));
  h.add("c");
  CHECK(h.hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("SHA-256 on the SHA extensions and the portable one agree on random messages in awkward pieces", "[digest]") {
  if (!sha256_sha_ni_available()) {
    WARN("this CPU (or a non-x86 build) has no SHA extensions: nothing to compare the portable SHA-256 with");
    CHECK_THROWS_WITH(Sha256(Sha256Engine::sha_ni), HasSubstr("this CPU or build has none"));
    return;
  }
  std::mt19937_64 rng(20261207);
  const std::size_t mib = std::size_t{1} << 20;
  std::string bytes(3 * mib + 100, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  // Lengths at the padding's and the blocks' edges, and past several MB; each starts 0 to 15 bytes into the
  // buffer, so the blocks the compression function reads in place sit at every alignment.
  const std::vector<std::size_t> lengths = {0,   1,    2,    31,   32,       55,      56,      57,      63,
                                            64,  65,   119,  120,  127,      128,     129,     191,     192,
                                            193, 1000, 4095, 4096, 4097, 2 * mib - 1, 2 * mib, 3 * mib + 65};
  const std::vector<std::vector<std::size_t>> piece_sizes = {
      {}, {1}, {55}, {56}, {63}, {64}, {65}, {0, 1, 55, 0, 56, 63, 64, 65}, {mib + 1, 3, 4093}};
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::size_t n = lengths[i];
    const std::string_view msg(bytes.data() + i % 16, n);
    const std::string portable = sha256(msg, Sha256Engine::portable);
    for (const auto& sizes : piece_sizes) {
      INFO(n << " random bytes at offset " << i % 16 << ", pieces cycling through " << sizes.size()
              << " size(s)" << (sizes.empty() ? " (the whole at once)" : ""));
      const std::string ni = sizes.empty() ? sha256(msg, Sha256Engine::sha_ni)
                                           : sha256_in_pieces(msg, sizes, Sha256Engine::sha_ni);
      CHECK(ni == portable);
      if (!sizes.empty() && n < 4096) CHECK(sha256_in_pieces(msg, sizes, Sha256Engine::portable) == portable);
    }
    // Random piece sizes up to a few blocks, the same draw for both.
    const uint64_t seed = rng();
    std::string by_engine[2];
    for (const Sha256Engine e : {Sha256Engine::portable, Sha256Engine::sha_ni}) {
      std::mt19937_64 cut(seed);
      Sha256 h(e);
      for (std::size_t at = 0; at < n;) {
        const std::size_t k = std::min<std::size_t>(cut() % 300, n - at);
        h.add(msg.data() + at, k);
        at += k;
      }
      by_engine[e == Sha256Engine::sha_ni] = h.hex();
    }
    INFO(n << " random bytes in random pieces");
    CHECK(by_engine[0] == portable);
    CHECK(by_engine[1] == portable);
  }
  // The default engine is one of the two: the same digest.
  CHECK(sha256(std::string_view(bytes)) == sha256(std::string_view(bytes), Sha256Engine::portable));
}

TEST_CASE("sha256_file: a file's size and SHA-256, read across its blocks; a missing file names itself", "[digest]") {
  test::TempDir tmp("digest");
  const fs::path file = tmp.path / "shard.bin";
  const std::size_t n = (std::size_t{5} << 20) + 3;  // past sha256_file's 4 MiB block
  {
    std::ofstream out(file, std::ios::binary);
    for (std::size_t i = 0; i < n; ++i) out.put(static_cast<char>((i * 7 + (i >> 8)) & 0xff));
  }
  const FileSha256 d = sha256_file(file);
  CHECK(d.bytes == n);
  CHECK(d.sha256 == "eb6d198d70dfd736f8aeb0e3af3d17dbab18e2e764eb8feef4ef197536d2b2c3");  // Python's hashlib
  std::ofstream(tmp.path / "empty", std::ios::binary).close();
  const FileSha256 e = sha256_file(tmp.path / "empty");
  CHECK(e.bytes == 0);
  CHECK(e.sha256 == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string missing = (tmp.path / "missing.safetensors").string();
  CHECK_THROWS_WITH(sha256_file(missing), HasSubstr(missing + ": cannot open it to record its SHA-256"));
}
