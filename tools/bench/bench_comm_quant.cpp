// Benchmark of the low-precision communication codecs on CUDA (dist/comm_quant.h), on Llama-3.2-1B shapes: one
// decoder block's seven projection weights (q 2048x2048, k and v 512x2048, o 2048x2048, gate and up 8192x2048,
// down 2048x8192; 60.8M values) sharded by whole rows over N ranks, for N = 1, 2 and 8:
//   - weight quantise: per weight, the local absmax pass and the quantise pass for a given absmax (HALO's rotation
//     and quantiser; each reads the f32 shard once, so the shard is read twice) -> int8 / fp8 codes;
//   - weight dequantise: the gathered block (all ranks' codes) back to f32 rows (codes·scale, then the inverse
//     rotation: an f32 intermediate written and read once);
//   - gradient block quantise (int8 / int4, blocks of 256) of the block's flat f32 gradient (N·c values), and
//     the receiver's dequantise-and-sum of its chunk from N ranks' codes.
// Each case is the median of 20 runs (3 warm-ups) between CUDA events on the default stream. GB/s counts the
// bytes each step must move at least (input once plus output), not the extra passes, so it is comparable with
// the copy bandwidth (about 4.3 TB/s on the H200). One JSON line per case:
//   bench_comm_quant [N filter, e.g. 8]
//   HT_BENCH_COMMIT / HT_BENCH_MACHINE override the commit (default `git rev-parse --short HEAD`) and machine.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "hadatrain/dist/comm_quant.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "timing.h"

using namespace ht;
using ht::bench::env_or;
using ht::bench::shell_line;

namespace {

struct Weight {
  const char* name;
  int64_t O, I;
};
const std::vector<Weight> kBlock = {{"q_proj", 2048, 2048}, {"k_proj", 512, 2048},  {"v_proj", 512, 2048},
                                    {"o_proj", 2048, 2048}, {"gate_proj", 8192, 2048}, {"up_proj", 8192, 2048},
                                    {"down_proj", 2048, 8192}};

struct Meta {
  std::string commit, machine, date;
};

void report(const Meta& m, const std::string& what, int64_t ranks, int64_t values, double bytes, double ms) {
  std::printf("{\"bench\": \"comm_quant\", \"case\": \"%s\", \"ranks\": %lld, \"values\": %lld, \"bytes\": %.0f, "
              "\"ms\": %.4f, \"gbps\": %.1f, \"commit\": \"%s\", \"machine\": \"%s\", \"date\": \"%s\"}\n",
              what.c_str(), static_cast<long long>(ranks), static_cast<long long>(values), bytes, ms,
              bytes / (ms * 1e-3) / 1e9, m.commit.c_str(), m.machine.c_str(), m.date.c_str());
  std::fflush(stdout);
}

void bench_weights(const Meta& meta, int64_t ranks, dist::GatherDType carrier) {
  struct Shard {
    dist::RowCodec codec;
    Tensor rows, absmax;   // (R, C) f32 on the GPU; the shared absmax
    grad::HaloQuantized gathered;  // (N·R, n) codes of every rank
  };
  std::vector<Shard> shards;
  int64_t values = 0, codes = 0, gathered_values = 0, gathered_codes = 0;
  uint64_t seed = 1;
  for (const Weight& w : kBlock) {
    Shard s;
    s.codec = dist::make_row_codec(carrier, w.I, w.name);
    const int64_t R = (w.O + ranks - 1) / ranks;
    Generator gen(seed++);
    s.rows = mul(randn({R, w.I}, gen, {DType::f32, Device::cuda(0)}), 0.02);
    s.absmax = mul(dist::rows_absmax(s.codec, s.rows), 1.25);
    s.gathered.codes = empty({ranks * R, s.codec.rotation.n},
                             {carrier == dist::GatherDType::int8 ? DType::i8 : DType::f8e4m3, Device::cuda(0)});
    fill_(s.gathered.codes, 0.0);
    s.gathered.scale = full({1}, 1e-3, {DType::f32, Device::cuda(0)});
    values += R * w.I;
    codes += R * s.codec.rotation.n;
    gathered_values += ranks * R * w.I;
    gathered_codes += ranks * R * s.codec.rotation.n;
    shards.push_back(std::move(s));
  }
  const std::string c = dist::gather_dtype_name(carrier);
  const double q_ms = bench::median_ms([&] {
    for (Shard& s : shards) {
      (void)dist::rows_absmax(s.codec, s.rows);
      (void)dist::quantize_rows(s.codec, s.rows, s.absmax);
    }
  });
  report(meta, "weight quantise " + c + " (absmax + quantise, one block's shard)", ranks, values,
         4.0 * static_cast<double>(values) + static_cast<double>(codes), q_ms);
  const double d_ms = bench::median_ms([&] {
    for (Shard& s : shards) (void)dist::dequantize_rows(s.codec, s.gathered);
  });
  report(meta, "weight dequantise " + c + " (one block gathered)", ranks, gathered_values,
         static_cast<double>(gathered_codes) + 4.0 * static_cast<double>(gathered_values), d_ms);
}

void bench_gradients(const Meta& meta, int64_t ranks, int bits) {
  int64_t P = 0;
  for (const Weight& w : kBlock) P += w.O * w.I;
  const int64_t c = (P + ranks - 1) / ranks, B = 256, cp = (c + B - 1) / B * B;
  const dist::QuantReduceSpec spec{.bits = bits, .block = B};
  Generator gen(7);
  const Tensor grad = mul(randn({ranks * c}, gen, {DType::f32, Device::cuda(0)}), 1e-3);
  const double payload = static_cast<double>(ranks * cp) * (bits / 8.0 + 4.0 / static_cast<double>(B));
  const std::string label = bits == 8 ? "int8" : "int4";
  const double q_ms = bench::median_ms([&] { (void)dist::quantize_blocks(grad, ranks, spec); });
  report(meta, "gradient quantise " + label + " block 256 (one block's gradient)", ranks, ranks * c,
         4.0 * static_cast<double>(ranks * c) + payload, q_ms);
  // N ranks' codes as the all-gather delivers them (every rank's the same here: the kernel's cost does not depend
  // on the values).
  const dist::BlockCodes mine = dist::quantize_blocks(grad, ranks, spec);
  std::vector<Tensor> codes(static_cast<std::size_t>(ranks), mine.codes), scales(static_cast<std::size_t>(ranks), mine.scales);
  const dist::BlockCodes all{cat(codes, 0), cat(scales, 0)};
  const double s_ms = bench::median_ms([&] { (void)dist::dequantize_sum(all, ranks, c, 0, spec); });
  report(meta, "gradient dequantise-and-sum " + label + " block 256 (this rank's chunk from N ranks)", ranks, c,
         static_cast<double>(ranks * cp) * (bits / 8.0 + 4.0 / static_cast<double>(B)) + 4.0 * static_cast<double>(c),
         s_ms);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_comm_quant: no CUDA device\n");
    return 1;
  }
  const std::string filter = argc > 1 ? argv[1] : "";
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const Meta meta{env_or("HT_BENCH_COMMIT", shell_line("git rev-parse --short HEAD 2>/dev/null")),
                  env_or("HT_BENCH_MACHINE", prop.name), date};
  for (const int64_t ranks : {1, 2, 8}) {
    if (!filter.empty() && std::to_string(ranks) != filter) continue;
    for (const auto carrier : {dist::GatherDType::int8, dist::GatherDType::fp8}) bench_weights(meta, ranks, carrier);
    for (const int bits : {8, 4}) bench_gradients(meta, ranks, bits);
  }
  return 0;
}
