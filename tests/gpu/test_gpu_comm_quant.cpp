// The low-precision communication codecs on CUDA (dist/comm_quant.h) against their CPU reference, bit for bit:
//   - 8-bit weight rows: the local absmax, the codes and scale for a given (larger, as after the max over ranks)
//     absmax, and the dequantised rows, for int8 and fp8, power-of-two and K·2^j rotations, padded columns and
//     LLaMA row lengths (2048, 5632 = 44·128, 8192);
//   - block codes of the quantised reduce-scatter (int8 and int4, chunks that need padding) and the
//     dequantise-and-sum kernel of cuda/kernels/comm_quant.cu for 1 to 4 ranks.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <vector>

#include "hadatrain/dist/comm_quant.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"

using namespace ht;
using test::kCuda;

TEST_CASE("8-bit weight rows on CUDA: absmax, codes, scale and dequantised rows equal the CPU's", "[gpu][comm_quant]") {
  struct Case {
    int64_t rows, cols;
  };
  const std::vector<Case> cases = {{7, 64}, {33, 96}, {5, 100}, {17, 2048}, {3, 5632}, {2, 8192}, {1300, 36}};
  uint64_t seed = 11;
  for (const Case& c : cases)
    for (const auto carrier : {dist::GatherDType::int8, dist::GatherDType::fp8}) {
      const dist::RowCodec codec = dist::make_row_codec(carrier, c.cols, "test");
      const Tensor x = test::random_input({c.rows, c.cols}, seed++, DType::f32, -0.1, 0.1);
      INFO("(" << c.rows << ", " << c.cols << ") " << dist::gather_dtype_name(carrier) << " rotation " << codec.rotation.n);
      const Tensor m_cpu = dist::rows_absmax(codec, x);
      const Tensor m_gpu = dist::rows_absmax(codec, x.to(kCuda));
      REQUIRE(test::compare_bits(m_gpu, m_cpu).empty());
      // The max over ranks is at least this shard's: quantise with a larger one, as a rank whose shard is not the
      // largest does.
      const Tensor shared = mul(m_cpu, 1.5);
      const auto q_cpu = dist::quantize_rows(codec, x, shared);
      const auto q_gpu = dist::quantize_rows(codec, x.to(kCuda), shared.to(kCuda));
      REQUIRE(test::compare_bits(q_gpu.codes, q_cpu.codes).empty());
      REQUIRE(test::compare_bits(q_gpu.scale, q_cpu.scale).empty());
      const Tensor w_cpu = dist::dequantize_rows(codec, q_cpu);
      const Tensor w_gpu = dist::dequantize_rows(codec, q_gpu);
      REQUIRE(w_gpu.is_cuda());
      REQUIRE(test::compare_bits(w_gpu, w_cpu).empty());
    }
}

TEST_CASE("block codes and the dequantise-and-sum kernel on CUDA equal the CPU's", "[gpu][comm_quant]") {
  uint64_t seed = 100;
  for (const int bits : {8, 4})
    for (const int64_t block : {32, 256})
      for (const int64_t ranks : {1, 2, 3, 4}) {
        const int64_t c = 1000 + 7 * ranks;  // not a multiple of the block: padded chunks
        const dist::QuantReduceSpec spec{.bits = bits, .block = block};
        INFO(bits << " bits, block " << block << ", " << ranks << " ranks");
        std::vector<Tensor> codes_cpu, scales_cpu, codes_gpu, scales_gpu;
        for (int64_t r = 0; r < ranks; ++r) {
          const Tensor x = test::random_input({ranks * c}, seed++, DType::f32, -3.0, 3.0);
          const auto b_cpu = dist::quantize_blocks(x, ranks, spec);
          const auto b_gpu = dist::quantize_blocks(x.to(kCuda), ranks, spec);
          REQUIRE(test::compare_bits(b_gpu.codes, b_cpu.codes).empty());
          REQUIRE(test::compare_bits(b_gpu.scales, b_cpu.scales).empty());
          codes_cpu.push_back(b_cpu.codes);
          scales_cpu.push_back(b_cpu.scales);
          codes_gpu.push_back(b_gpu.codes);
          scales_gpu.push_back(b_gpu.scales);
        }
        const dist::BlockCodes all_cpu{cat(codes_cpu, 0), cat(scales_cpu, 0)};
        const dist::BlockCodes all_gpu{cat(codes_gpu, 0), cat(scales_gpu, 0)};
        for (int64_t dest = 0; dest < ranks; ++dest) {
          const Tensor s_cpu = dist::dequantize_sum(all_cpu, ranks, c, dest, spec);
          const Tensor s_gpu = dist::dequantize_sum(all_gpu, ranks, c, dest, spec);
          REQUIRE(s_gpu.is_cuda());
          REQUIRE(test::compare_bits(s_gpu, s_cpu).empty());
        }
      }
}
