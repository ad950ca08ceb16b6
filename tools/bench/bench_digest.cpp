// Digest throughput (CPU; every build): SHA-256 and CRC-32 (core/digest.h) over one buffer in memory, the cost that
// a converted checkpoint's source record adds per byte of its source files (docs/language_models.md, Provenance).
// SHA-256 runs on each compression function this machine has: the portable one, and the one on the x86 SHA
// extensions where the CPU has them (the one Sha256 takes there); both must print the same digest.
// Prints the wall and CPU seconds of each pass and MB/s by both; CPU time tells a pass slowed by other processes
// on the machine from a slow digest. The buffer is filled with varied bytes (SHA-256's and CRC-32's speed do not
// depend on the data).
//   bench_digest [MiB, default 1024] [passes, default 3]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "hadatrain/core/digest.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Timed {
  double wall_s = 0, cpu_s = 0;
};

template <class F>
Timed timed(F&& f) {
  const Clock::time_point t0 = Clock::now();
  const std::clock_t c0 = std::clock();
  f();
  return {std::chrono::duration<double>(Clock::now() - t0).count(),
          static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC};
}

void report(const char* what, std::size_t bytes, const Timed& t, const std::string& value) {
  fmt::print("{:8} {:6.3f} s wall {:6.0f} MB/s | {:6.3f} s CPU {:6.0f} MB/s | {}\n", what, t.wall_s,
             static_cast<double>(bytes) / t.wall_s / 1e6, t.cpu_s, static_cast<double>(bytes) / t.cpu_s / 1e6, value);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::stoul(argv[1]) : 1024;
  const int passes = argc > 2 ? std::stoi(argv[2]) : 3;
  std::vector<unsigned char> buf(mib << 20);
  uint32_t x = 2463534242u;  // xorshift32
  for (unsigned char& b : buf) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<unsigned char>(x);
  }
  std::vector<std::pair<const char*, ht::Sha256Engine>> engines = {{"sha256", ht::Sha256Engine::portable}};
  if (ht::sha256_sha_ni_available()) engines.emplace_back("sha256ni", ht::Sha256Engine::sha_ni);
  fmt::print("digest throughput over {} MiB in memory, {} pass(es) each; sha256: portable C++, sha256ni: x86 SHA "
             "extensions ({})\n",
             mib, passes, ht::sha256_sha_ni_available() ? "this CPU has them" : "not on this CPU or build");
  for (int p = 0; p < passes; ++p) {
    for (const auto& [name, engine] : engines) {
      std::string hex;
      const Timed sha = timed([&] {
        ht::Sha256 h(engine);
        h.add(buf.data(), buf.size());
        hex = h.hex();
      });
      report(name, buf.size(), sha, hex);
    }
    uint32_t crc = 0;
    const Timed c = timed([&] { crc = ht::crc32_update(0, buf.data(), buf.size()); });
    report("crc32", buf.size(), c, fmt::format("{:08x}", crc));
  }
  return 0;
}
