// CUDA quantisation primitives (cuda/kernels/grad_quant*.cu) against the CPU reference, bit for bit
// (Note [Bit-identical quantisation]): quantize for every granularity × scale rule × rounding × Hadamard
// block T in {1, 2, 16} on odd-sized random inputs (fused one-block-per-group path, two-pass path, block
// mode for last dims that are not a multiple of 16, pre-rotation for T > 16 and for 1-D sample groups),
// non-contiguous inputs and every floating input dtype; LUQ codes; hadamard_blocks; dequantize;
// pack / unpack int4; int8 and e4m3 level outputs and dequantised bf16 / f16 / f32 outputs; every team size
// of the fused kernel. CUDA outputs are poisoned (0xFF) so an element a kernel forgot to write fails.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/quant.h"
#include "hadatrain/tensor/philox.h"
#include "cuda/kernels/grad_quant.cuh"  // grad_quant_of_transpose_launches

using namespace ht;
using namespace ht::grad;

namespace {

const std::vector<Granularity> kGranularities = {Granularity::tensor, Granularity::sample, Granularity::row};

std::string name_of(Granularity g) {
  return g == Granularity::tensor ? "tensor" : (g == Granularity::sample ? "sample" : "row");
}

// "" when values and scales of the CUDA result equal the CPU result bit for bit.
std::string same_bits(const Quantized& gpu, const Quantized& cpu) {
  std::string msg = test::compare_bits(gpu.values, cpu.values);
  if (!msg.empty()) return "values: " + msg;
  msg = test::compare_bits(gpu.scale, cpu.scale);
  if (!msg.empty()) return "scale: " + msg;
  return {};
}

// quantize on CUDA with the outputs poisoned (0xFF), so an element a kernel forgot to write fails the comparison.
Quantized quantize_poisoned(const Tensor& x, const QuantSpec& spec) {
  test::PoisonGuard poison;
  return quantize(x, spec);
}

// Quantises xc (CPU) and xg (the same values on CUDA, possibly another layout) with every combination.
void check_all_specs(const Tensor& xc, const Tensor& xg, const std::vector<int64_t>& blocks, int bits = 4) {
  const int64_t last = xc.size(xc.dim() - 1);
  for (int64_t block : blocks) {
    if (last % block != 0) continue;
    for (Granularity g : kGranularities)
      for (ScaleRule rule : {ScaleRule::absmax, ScaleRule::sawb})
        for (Rounding r : {Rounding::nearest, Rounding::stochastic})
          for (DType vdt : {DType::i8, DType::f8e4m3}) {
            if (vdt == DType::f8e4m3 && bits > 5) continue;
            QuantSpec spec;
            spec.bits = bits;
            spec.granularity = g;
            spec.scale_rule = rule;
            spec.rounding = r;
            spec.hadamard_block = block;
            spec.noise = {0x5eedull, 0xabcdef12345ull};
            spec.values_dtype = vdt;
            CAPTURE(xc.describe(), block, name_of(g), rule == ScaleRule::sawb, r == Rounding::stochastic, bits,
                    dtype_name(vdt));
            const Quantized qc = quantize(xc, spec);
            const Quantized qg = quantize_poisoned(xg, spec);
            CHECK(qg.values.dtype() == vdt);
            CHECK(same_bits(qg, qc) == "");
            CHECK(test::compare_bits(dequantize(qg, g), dequantize(qc, g)) == "");
          }
  }
}

// Row-granularity quantisation (the fused kernel) of x on both devices, stochastic, T = the largest power of
// two <= 16 dividing the rows, e4m3 or int8 values: "" when CUDA equals the CPU bit for bit.
std::string check_rows(const Tensor& xc, const Tensor& xg, int bits, DType vdt) {
  const int64_t last = xc.size(xc.dim() - 1);
  QuantSpec spec;
  spec.bits = bits;
  spec.granularity = Granularity::row;
  spec.rounding = Rounding::stochastic;
  spec.hadamard_block = std::min<int64_t>(16, last & -last);  // the largest power of two <= 16 dividing the rows
  spec.noise = {77, 0x123456789ull};
  spec.values_dtype = vdt;
  const Quantized qc = quantize(xc, spec);
  const Quantized qg = quantize_poisoned(xg, spec);
  return same_bits(qg, qc);
}

}  // namespace

TEST_CASE("CUDA quantize equals the CPU bit for bit on odd-sized random inputs", "[gpu][grad_quant]") {
  // (3, 37, 48): 111 rows (fused), tensor / sample groups (two-pass); (257, 768): 257 rows and samples (fused);
  // (3, 20000): rows longer than one fused block (two-pass rows); (7, 13, 10): block mode (10 % 16 != 0).
  const std::vector<Shape> shapes = {{3, 37, 48}, {257, 768}, {3, 20000}, {7, 13, 10}};
  uint64_t seed = 100;
  for (const Shape& shape : shapes)
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor x = test::random_input(shape, ++seed, dt);
      check_all_specs(x, x.to(test::kCuda), {1, 2, 16});
    }
  // 8 bits and 2 bits on one shape.
  const Tensor x = test::random_input({5, 9, 32}, 7, DType::f32);
  check_all_specs(x, x.to(test::kCuda), {1, 16}, 8);
  check_all_specs(x, x.to(test::kCuda), {2}, 2);
}

TEST_CASE("CUDA quantize: non-contiguous inputs, f16 / f64 / fp8 inputs, large blocks, 1-D inputs",
          "[gpu][grad_quant]") {
  // Non-contiguous: a permuted view on both devices.
  const Tensor base = test::random_input({48, 3, 37}, 21, DType::bf16);
  check_all_specs(base.permute({1, 2, 0}), base.to(test::kCuda).permute({1, 2, 0}), {1, 2, 16});
  const Tensor base2 = test::random_input({64, 17}, 22, DType::f32);
  check_all_specs(base2.transpose(0, 1), base2.to(test::kCuda).transpose(0, 1), {1, 16});
  // Other input dtypes (f64 and fp8 are converted to f32 first on both sides).
  for (DType dt : {DType::f16, DType::f64, DType::f8e4m3}) {
    const Tensor x = test::random_input({11, 64}, 23, dt);
    check_all_specs(x, x.to(test::kCuda), {1, 16});
  }
  // T > 16: rotated by a separate pass first.
  const Tensor big = test::random_input({9, 256}, 24, DType::bf16);
  check_all_specs(big, big.to(test::kCuda), {32, 256});
  // 1-D: sample groups of one element straddle the Hadamard blocks (pre-rotation path).
  const Tensor one = test::random_input({96}, 25, DType::f32);
  check_all_specs(one, one.to(test::kCuda), {1, 4, 16});
}

TEST_CASE("CUDA codes of ties, signed zeros, NaN and inf equal the CPU's", "[gpu][grad_quant]") {
  // Note [Signed nearest levels]: with T = 1 and m = 7 (4 bits: r = 1) the levels are the values themselves, so
  // row 0 puts exact ties (±0.5, ±1.5, ±2.5, ±6.5), small negatives (level −0) and ±0 before the rounding; row 1
  // has an infinite element (m = inf, r = 0: NaN for that element, −0 for the negative ones), row 2 a NaN (no
  // effect on m; its clamp gives −m), row 3 zeros (m = 0). 64 columns: the fused item kernel; 20000: two passes
  // with the item apply kernel. T = 16 rotates the same rows. int8 and e4m3 codes, 4 and 8 bits, both roundings;
  // with T = 1 and one scale also into transposed values (the strip kernel).
  const float pattern[] = {7.0f,  -7.0f, 0.5f, -0.5f, 1.5f,  -1.5f, 2.5f,  -2.5f, 6.5f,  -6.5f, -0.25f,
                           0.25f, 0.0f,  -0.0f, 3.5f, -3.5f, 4.49f, -4.51f, 5.5f, -5.5f, -0.5f, 0.5f};
  constexpr int kPattern = sizeof(pattern) / sizeof(pattern[0]);
  for (int64_t cols : {int64_t{64}, int64_t{20000}}) {
    std::vector<float> v(static_cast<std::size_t>(4 * cols), 0.0f);
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < cols; ++c) v[static_cast<std::size_t>(r * cols + c)] = pattern[c % kPattern];
    v[static_cast<std::size_t>(cols + 5)] = std::numeric_limits<float>::infinity();
    v[static_cast<std::size_t>(2 * cols + 6)] = std::numeric_limits<float>::quiet_NaN();
    for (DType in : {DType::f32, DType::bf16}) {
      const Tensor x = from_vector(v, {4, cols}, {DType::f32}).to(in);
      const Tensor xg = x.to(test::kCuda);
      for (int64_t block : {int64_t{1}, int64_t{16}})
        for (Granularity g : {Granularity::row, Granularity::tensor})
          for (Rounding r : {Rounding::nearest, Rounding::stochastic})
            for (DType vdt : {DType::i8, DType::f8e4m3})
              for (int bits : {4, 8}) {
                if (vdt == DType::f8e4m3 && bits > 5) continue;
                QuantSpec spec;
                spec.bits = bits;
                spec.granularity = g;
                spec.rounding = r;
                spec.hadamard_block = block;
                spec.noise = {0x5eedull, 0x99ull};
                spec.values_dtype = vdt;
                CAPTURE(cols, dtype_name(in), block, name_of(g), r == Rounding::stochastic, dtype_name(vdt), bits);
                CHECK(same_bits(quantize_poisoned(xg, spec), quantize(x, spec)) == "");
                if (block == 1 && g == Granularity::tensor) {  // transposed values: the strip kernel's codes
                  spec.layout = ValuesLayout::transposed;
                  CHECK(same_bits(quantize_poisoned(xg, spec), quantize(x, spec)) == "");
                }
              }
    }
  }
}

TEST_CASE("CUDA quantize of a transposed weight reads the weight in place", "[gpu][grad_quant]") {
  // Note [Quantiser of a transposed input]: x = Wᵀ of a dense bf16 / f16 (R, C) W, T = 16, one scale: every scale
  // rule, rounding and code dtype give the CPU's codes and scale and the dense copy's on CUDA, through the in-place
  // path (its launch count); an f32 W and C % 8 != 0 take the general path (the dense copy) and agree too. R = 64
  // and 256 put four lanes on a column group in pass 3, R = 96 two, R = 48 one.
  uint64_t seed = 700;
  struct Case {
    int64_t R, C;
    DType dt;
    bool in_place;
  };
  const Case cases[] = {{64, 40, DType::bf16, true},
                        {256, 1024, DType::bf16, true},
                        {48, 24, DType::f16, true},
                        {96, 520, DType::bf16, true},
                        {64, 40, DType::f32, false},
                        {32, 12, DType::bf16, false}};
  for (const Case& c : cases) {
    const Tensor w = test::random_input({c.R, c.C}, ++seed, c.dt);
    const Tensor wg = w.to(test::kCuda);
    for (ScaleRule rule : {ScaleRule::absmax, ScaleRule::sawb})
      for (Rounding r : {Rounding::nearest, Rounding::stochastic})
        for (DType vdt : {DType::i8, DType::f8e4m3}) {
          QuantSpec spec;
          spec.bits = 4;
          spec.granularity = Granularity::tensor;
          spec.scale_rule = rule;
          spec.rounding = r;
          spec.hadamard_block = 16;
          spec.noise = {0x5eedull, 0x77ull};
          spec.values_dtype = vdt;
          CAPTURE(c.R, c.C, dtype_name(c.dt), rule == ScaleRule::sawb, r == Rounding::stochastic, dtype_name(vdt));
          const int64_t before = kernels::grad_quant_of_transpose_launches();
          const Quantized qg = quantize_poisoned(wg.transpose(0, 1), spec);
          CHECK(kernels::grad_quant_of_transpose_launches() - before == (c.in_place ? 1 : 0));
          CHECK(same_bits(qg, quantize(w.transpose(0, 1), spec)) == "");
          const Quantized dense = quantize(wg.transpose(0, 1).contiguous(), spec);  // the general path, on CUDA
          CHECK(test::compare_bits(qg.values, dense.values.to(Device::cpu())) == "");
          CHECK(test::compare_bits(qg.scale, dense.scale.to(Device::cpu())) == "");
        }
  }
}

TEST_CASE("CUDA quantize at pipeline sizes (fused rows, two-pass samples)", "[gpu][grad_quant]") {
  const Tensor rows = test::random_input({1001, 3072}, 31, DType::bf16);
  const Tensor samples = test::random_input({5, 197 * 768}, 32, DType::bf16);
  for (const Tensor& x : {rows, samples}) {
    const Tensor xg = x.to(test::kCuda);
    for (Granularity g : kGranularities) {
      QuantSpec spec;
      spec.granularity = g;
      spec.hadamard_block = 16;
      spec.noise = {1, 2};
      CAPTURE(x.describe(), name_of(g));
      const Quantized qc = quantize(x, spec);
      const Quantized qg = quantize_poisoned(xg, spec);
      CHECK(same_bits(qg, qc) == "");
    }
  }
}

TEST_CASE("CUDA fused quantiser: every team size, partial last blocks, unaligned inputs", "[gpu][grad_quant]") {
  // Row lengths -> items of 8 -> threads per group (team, at least 2 for T = 16) with the slots a thread takes
  // (Note [Item slots]: codes take 3 or 4 where that team costs less): 8 (T = 8, team 1, 2 slots), 16 (team 2, 2
  // slots), 48 (team 2, 3 slots), 160 (team 8, 3), 768 (96 items, team 32, 3), 1040 (130 items, team 64, 3),
  // 1024 (128 items, team 32, 4), 2304 (288 items, team 96, 3), 3072 (384 items, team 96, 4), 4096 (512 items,
  // team 128, 4), 14336 (1792 items, team 448, 4), 16384 (2048 items, team 512, 4); the dequantised outputs of the
  // next test case and SAWB keep 2 slots; the unaligned input below (and LUQ) runs the unit kernel. Row counts that
  // leave the last block of teams partly empty.
  struct Case {
    int64_t rows, len;
  };
  uint64_t seed = 300;
  for (const Case c : {Case{70, 8}, Case{70, 16}, Case{67, 48}, Case{99, 160}, Case{131, 768}, Case{67, 1040},
                       Case{71, 1024}, Case{69, 2304}, Case{67, 3072}, Case{69, 4096}, Case{33, 14336},
                       Case{66, 16384}})
    for (DType dt : {DType::bf16, DType::f32}) {
      const Tensor x = test::random_input({c.rows, c.len}, ++seed, dt);
      const Tensor xg = x.to(test::kCuda);
      CAPTURE(x.describe());
      CHECK(check_rows(x, xg, 4, DType::f8e4m3) == "");
      CHECK(check_rows(x, xg, 4, DType::i8) == "");
      CHECK(check_rows(x, xg, 8, DType::i8) == "");
    }
  // An input whose data pointer is not 16-byte aligned (a view 3 elements into its storage): the kernels
  // fall back to element-wise loads in chunk mode; the noise index is still the logical one.
  const Tensor flat = test::random_input({3 + 40 * 64}, 320, DType::bf16);
  const Tensor xc = flat.narrow(0, 3, 40 * 64).reshape({40, 64});
  const Tensor xg = flat.to(test::kCuda).narrow(0, 3, 40 * 64).reshape({40, 64});
  CHECK(check_rows(xc, xg, 4, DType::f8e4m3) == "");
  check_all_specs(xc, xg, {1, 16});
  // Block mode (rows not a multiple of 16) with 8-element Hadamard blocks at odd noise offsets.
  const Tensor odd = test::random_input({101, 24}, 321, DType::f32);
  CHECK(check_rows(odd, odd.to(test::kCuda), 4, DType::f8e4m3) == "");
}

TEST_CASE("CUDA quantize writes the CPU's dequantised bf16 / f16 / f32 values bit for bit", "[gpu][grad_quant]") {
  // (37, 48): fused item kernel for row / sample / tensor groups (T 16, 4, 1); (37, 64) with T 32: pre-rotated;
  // (3, 20000): rows too long to fuse, two passes with the item apply kernel; (2, 20002) with T 2: two passes
  // with the unit apply kernel (20002 % 8 != 0); (7, 13, 10): the fused unit kernel in block mode; (448, 768)
  // tensor-wide: one huge group (partial reduction, then apply). A zero row, and a row with an infinite element
  // (scale inf: NaN products, stored as the quiet NaN on both devices).
  struct Case {
    Shape shape;
    std::vector<int64_t> blocks;
  };
  const std::vector<Case> cases = {{{37, 48}, {1, 4, 16}},
                                   {{37, 64}, {32}},
                                   {{3, 20000}, {1, 16}},
                                   {{2, 20002}, {2}},
                                   {{7, 13, 10}, {1, 2}},
                                   {{448, 768}, {16}}};
  uint64_t seed = 600;
  for (const Case& c : cases)
    for (DType in : {DType::bf16, DType::f32}) {
      Tensor x = test::random_input(c.shape, ++seed, in);
      if (c.shape[0] > 2) {
        fill_(x.narrow(0, 1, 1), 0.0);
        if (c.shape.size() == 2 && c.shape[0] == 37)
          fill_(x.narrow(0, 2, 1).narrow(1, 3, 1), std::numeric_limits<double>::infinity());
      }
      const Tensor xg = x.to(test::kCuda);
      for (int64_t block : c.blocks)
        for (Granularity g : kGranularities)
          for (ScaleRule rule : {ScaleRule::absmax, ScaleRule::sawb})
            for (Rounding r : {Rounding::nearest, Rounding::stochastic})
              for (DType vdt : {DType::bf16, DType::f16, DType::f32}) {
                QuantSpec spec;
                spec.bits = vdt == DType::f16 ? 8 : 4;
                spec.granularity = g;
                spec.scale_rule = rule;
                spec.rounding = r;
                spec.hadamard_block = block;
                spec.noise = {0x5eedull, seed};
                spec.values_dtype = vdt;
                spec.report_input_absmax = block == 16;
                CAPTURE(x.describe(), block, name_of(g), rule == ScaleRule::sawb, r == Rounding::stochastic,
                        dtype_name(vdt));
                const Quantized qc = quantize(x, spec);
                const Quantized qg = quantize_poisoned(xg, spec);
                CHECK(qg.values.dtype() == vdt);
                CHECK(qg.values.shape() == c.shape);
                CHECK(same_bits(qg, qc) == "");
                if (spec.report_input_absmax) CHECK(test::compare_bits(qg.input_absmax, qc.input_absmax) == "");
              }
    }
  // A known absmax (tensor granularity: no statistics pass, the apply kernels compute the level, Note [Known m in
  // pass 3]; several blocks, of which only the first stores the scale) on an aligned input (item kernel) and on one
  // that is not 16-byte aligned (unit kernel, element loads), stochastic and nearest; and an input that is not
  // 16-byte aligned through the fused unit kernel in chunk mode.
  const Tensor x = test::random_input({64, 96}, 650, DType::bf16);
  const Tensor flat = test::random_input({3 + 40 * 64}, 651, DType::bf16);
  const Tensor uc = flat.narrow(0, 3, 40 * 64).reshape({40, 64});
  const Tensor ug = flat.to(test::kCuda).narrow(0, 3, 40 * 64).reshape({40, 64});
  for (DType vdt : {DType::i8, DType::f8e4m3, DType::bf16, DType::f16, DType::f32})
    for (Rounding rounding : {Rounding::stochastic, Rounding::nearest}) {
      QuantSpec known;
      known.noise = {9, 10};
      known.values_dtype = vdt;
      known.rounding = rounding;
      known.known_absmax = from_vector(std::vector<float>{1.5f}, {1});
      known.report_input_absmax = true;
      const Quantized kc = quantize(x, known), kuc = quantize(uc, known);
      known.known_absmax = known.known_absmax.to(test::kCuda);
      const Quantized kg = quantize_poisoned(x.to(test::kCuda), known), kug = quantize_poisoned(ug, known);
      CAPTURE(dtype_name(vdt), rounding == Rounding::stochastic);
      CHECK(same_bits(kg, kc) == "");
      CHECK(test::compare_bits(kg.input_absmax, kc.input_absmax) == "");
      CHECK(same_bits(kug, kuc) == "");
      CHECK(kc.scale.item() == Approx(1.5 / 7.0).epsilon(1e-7));  // s = m / qmax: the given m, not max |x|
    }
  for (DType vdt : {DType::bf16, DType::f16, DType::f32}) {
    CAPTURE(dtype_name(vdt));
    QuantSpec rows;
    rows.granularity = Granularity::row;
    rows.hadamard_block = 16;
    rows.noise = {11, 12};
    rows.values_dtype = vdt;
    const Quantized rc = quantize(uc, rows);
    CHECK(same_bits(quantize_poisoned(ug, rows), rc) == "");
  }
}

TEST_CASE("CUDA quantize with transposed values (tile and strip kernels) equals the CPU", "[gpu][grad_quant]") {
  // (N, C): the tile kernel: tiles of 64 × 64 with partial edges; N % 4 != 0 (byte stores); C % 8 != 0
  // (quantise, then transpose); an unaligned input (element loads). The strip kernel (Note [Transposed quantiser
  // strips]: C % 8 == 0, N % 4 == 0, aligned): partial strips of 128 rows in bf16, f32 and f16 (a view 16 bytes
  // into its storage), and the ViT-B-like (64·197, 768) in bf16.
  struct Case {
    Shape shape;
    DType dtype;
    int64_t offset;  // elements the input view starts into its storage
  };
  const std::vector<Case> cases = {{{2, 100, 136}, DType::bf16, 0}, {{129, 64}, DType::f32, 0},
                                   {{67, 40}, DType::bf16, 0},      {{50, 20}, DType::f32, 0},
                                   {{97, 72}, DType::f16, 3},       {{64 * 197, 768}, DType::bf16, 0},
                                   {{2, 100, 144}, DType::bf16, 0}, {{132, 32}, DType::f32, 0},
                                   {{36, 48}, DType::f16, 8}};
  uint64_t seed = 400;
  for (const Case& c : cases) {
    const int64_t n = numel_of(c.shape);
    const Tensor flat = test::random_input({n + c.offset}, ++seed, c.dtype);
    const Tensor xc = flat.narrow(0, c.offset, n).reshape(c.shape);
    const Tensor xg = flat.to(test::kCuda).narrow(0, c.offset, n).reshape(c.shape);
    for (ScaleRule rule : {ScaleRule::absmax, ScaleRule::sawb})
      for (Rounding r : {Rounding::nearest, Rounding::stochastic})
        for (int bits : {8, 4}) {
          QuantSpec spec;
          spec.bits = bits;
          spec.granularity = Granularity::tensor;
          spec.scale_rule = rule;
          spec.rounding = r;
          spec.noise = {5, 6};
          spec.layout = ValuesLayout::transposed;
          if (bits == 4) spec.values_dtype = DType::f8e4m3;
          CAPTURE(xc.describe(), rule == ScaleRule::sawb, r == Rounding::stochastic, bits);
          const Quantized qc = quantize(xc, spec);
          const Quantized qg = quantize_poisoned(xg, spec);
          CHECK(qg.values.shape() == qc.values.shape());
          CHECK(same_bits(qg, qc) == "");
        }
  }
  // A zero tensor: zeros and scale 0 (70 rows: the tile kernel; 72: the strip kernel).
  for (const int64_t rows : {70, 72}) {
    const Tensor z = zeros({rows, 16});
    QuantSpec spec;
    spec.bits = 8;
    spec.layout = ValuesLayout::transposed;
    CHECK(same_bits(quantize_poisoned(z.to(test::kCuda), spec), quantize(z, spec)) == "");
  }
}

TEST_CASE("CUDA quantize reports max |x| and takes a known absmax like the CPU", "[gpu][grad_quant]") {
  // Fused rows (T 16), two-pass samples, pre-rotation (T 32), transposed values; bf16 and f32; a NaN-free
  // input whose largest magnitude is negative.
  uint64_t seed = 500;
  for (const Shape& shape : std::vector<Shape>{{3, 37, 64}, {2, 20000}, {64 * 7, 768}})
    for (DType dt : {DType::bf16, DType::f32}) {
      Tensor x = test::random_input(shape, ++seed, dt);
      fill_(x.narrow(0, 1, 1), -7.25);
      const Tensor xg = x.to(test::kCuda);
      for (Granularity g : kGranularities)
        for (int64_t block : {1, 16, 32}) {
          QuantSpec spec;
          spec.granularity = g;
          spec.hadamard_block = block;
          spec.noise = {3, 4};
          spec.report_input_absmax = true;
          CAPTURE(x.describe(), name_of(g), block);
          const Quantized qc = quantize(x, spec);
          const Quantized qg = quantize_poisoned(xg, spec);
          CHECK(same_bits(qg, qc) == "");
          CHECK(test::compare_bits(qg.input_absmax, qc.input_absmax) == "");
          CHECK(qc.input_absmax.item() == 7.25);
          // The HLA use: the same x, tensor absmax scale, given m, transposed values.
          QuantSpec known;
          known.bits = 8;
          known.noise = {5, 6};
          known.layout = ValuesLayout::transposed;
          known.known_absmax = qc.input_absmax;
          const Quantized kc = quantize(x, known);
          known.known_absmax = qg.input_absmax;
          known.report_input_absmax = block == 16;  // also reported without a statistics pass (separate maximum)
          const Quantized kg = quantize_poisoned(xg, known);
          CHECK(same_bits(kg, kc) == "");
          if (known.report_input_absmax) CHECK(test::compare_bits(kg.input_absmax, qc.input_absmax) == "");
        }
    }
}

TEST_CASE("CUDA quantize handles zero groups and empty tensors", "[gpu][grad_quant]") {
  Tensor x = test::random_input({6, 32}, 41, DType::f32);
  fill_(x.narrow(0, 2, 1), 0.0);
  check_all_specs(x, x.to(test::kCuda), {1, 16});
  const Tensor z = zeros({4, 16});
  check_all_specs(z, z.to(test::kCuda), {1, 16});
  test::PoisonGuard poison;
  const Quantized e = quantize(zeros({0, 16}, {DType::f32, test::kCuda}), QuantSpec{});
  CHECK(e.values.numel() == 0);
  CHECK(e.scale.to_vector<double>() == std::vector<double>{0.0});
}

TEST_CASE("CUDA luq_quantize gives the CPU's e4m3 codes and scales", "[gpu][grad_quant]") {
  uint64_t seed = 50;
  for (const Shape& shape : std::vector<Shape>{{3, 37, 48}, {257, 768}, {7, 13, 10}, {2, 40000}})
    for (DType dt : {DType::f32, DType::bf16})
      for (Granularity g : kGranularities)
        for (int bits : {2, 4}) {
          const Tensor x = test::random_input(shape, ++seed, dt, -3.0, 1.0);  // mostly negative
          LuqSpec spec;
          spec.bits = bits;
          spec.granularity = g;
          spec.noise = {seed, 9};
          CAPTURE(x.describe(), name_of(g), bits);
          const Quantized qc = luq_quantize(x, spec);
          Quantized qg;
          {
            test::PoisonGuard poison;
            qg = luq_quantize(x.to(test::kCuda), spec);
          }
          CHECK(same_bits(qg, qc) == "");
        }
  // Non-contiguous.
  const Tensor base = test::random_input({48, 21}, 60, DType::f32);
  LuqSpec spec;
  spec.noise = {4, 4};
  test::PoisonGuard poison;
  CHECK(same_bits(luq_quantize(base.to(test::kCuda).transpose(0, 1), spec), luq_quantize(base.transpose(0, 1), spec)) ==
        "");
}

TEST_CASE("CUDA hadamard_blocks equals the CPU butterfly bit for bit", "[gpu][grad_quant]") {
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (int64_t block : {1, 2, 4, 8, 16, 32, 128}) {
      const Tensor x = test::random_input({5, 7, 128}, 70 + static_cast<uint64_t>(block), dt);
      CAPTURE(x.describe(), block);
      test::PoisonGuard poison;
      CHECK(test::compare_bits(hadamard_blocks(x.to(test::kCuda), block), hadamard_blocks(x, block)) == "");
    }
  // Block mode (last dim not a multiple of 16) and a non-contiguous input.
  const Tensor x = test::random_input({9, 6}, 80, DType::f32);
  test::PoisonGuard poison;
  CHECK(test::compare_bits(hadamard_blocks(x.to(test::kCuda), 2), hadamard_blocks(x, 2)) == "");
  const Tensor y = test::random_input({32, 9}, 81, DType::bf16);
  CHECK(test::compare_bits(hadamard_blocks(y.to(test::kCuda).transpose(0, 1), 16), hadamard_blocks(y.transpose(0, 1), 16)) ==
        "");
}

TEST_CASE("CUDA pack_int4 / unpack_int4 equal the CPU", "[gpu][grad_quant]") {
  const Tensor v = to_dtype(test::random_input({37, 66}, 90, DType::i32, -8, 7), DType::i8);
  test::PoisonGuard poison;
  const Tensor pg = pack_int4(v.to(test::kCuda));
  const Tensor pc = pack_int4(v);
  CHECK(pg.dtype() == DType::i4x2);
  CHECK(pg.is_cuda());
  // Raw packed bytes, read back without conversion.
  std::vector<uint8_t> host(static_cast<std::size_t>(pg.nbytes()));
  const Tensor back = pg.to(Device::cpu());
  std::memcpy(host.data(), back.data_ptr(), host.size());
  CHECK(std::memcmp(host.data(), pc.data_ptr(), host.size()) == 0);
  CHECK(test::compare_bits(unpack_int4(pg), unpack_int4(pc)) == "");
  CHECK(test::compare_bits(unpack_int4(pg), v) == "");
  // Non-contiguous values.
  const Tensor t = v.to(test::kCuda).transpose(0, 1);  // (66, 37)
  CHECK(test::compare_bits(unpack_int4(pack_int4(t.narrow(1, 0, 36))), v.transpose(0, 1).narrow(1, 0, 36).contiguous()) ==
        "");
}

TEST_CASE("CUDA quantisers with a device step word draw the host-step stream's bits", "[gpu][grad_quant][graph]") {
  // Note [Pipeline noise]: StepClock::word holds (step mod 2^40) << 8 and the kernels add it to the step-0
  // stream; the bits must equal the CPU's with philox_stream(layer, step, role) itself.
  const uint32_t layer = 5, role = 2;
  for (int64_t step : {int64_t{1}, int64_t{3}, int64_t{1} << 39}) {
    grad::StepClock clock;
    clock.keep_on_device(test::kCuda);
    clock.set(step);
    REQUIRE(clock.word.defined());
    CHECK(clock.word.to(Device::cpu()).item() == static_cast<double>(static_cast<uint64_t>(step) << 8));
    grad::NoiseKey device_key{11, layer, step, clock.word.data<int64_t>()};
    grad::NoiseKey host_key{11, layer, step};
    const Noise dn = device_key.noise(role), hn = host_key.noise(role);
    CHECK(dn.stream == philox_stream(layer, 0, role));
    CHECK(hn.stream == philox_stream(layer, static_cast<uint64_t>(step), role));
    CAPTURE(step);
    const Tensor x = test::random_input({64, 197, 48}, 900 + static_cast<uint64_t>(step & 0xFF), DType::bf16);
    const Tensor xg = x.to(test::kCuda);
    for (Granularity g : kGranularities) {
      QuantSpec spec;
      spec.granularity = g;
      spec.rounding = Rounding::stochastic;
      spec.hadamard_block = 16;
      spec.noise = hn;
      const Quantized qc = quantize(x, spec);
      spec.noise = dn;
      const Quantized qg = quantize_poisoned(xg, spec);
      CHECK(same_bits(qg, qc) == "");
    }
    // 8 bits, tensor scale, transposed values (the HLA g_w quantiser).
    QuantSpec t;
    t.bits = 8;
    t.granularity = Granularity::tensor;
    t.rounding = Rounding::stochastic;
    t.layout = ValuesLayout::transposed;
    t.noise = hn;
    const Quantized tc = quantize(x, t);
    t.noise = dn;
    CHECK(same_bits(quantize(xg, t), tc) == "");
    LuqSpec l;
    l.noise = hn;
    const Quantized lc = luq_quantize(x, l);
    l.noise = dn;
    CHECK(same_bits(luq_quantize(xg, l), lc) == "");
  }
  // The CPU quantisers cannot read a device word.
  int64_t host_word = 0;
  QuantSpec spec;
  spec.noise = {1, 2, &host_word};
  CHECK_THROWS_WITH(quantize(test::random_input({4, 16}, 3, DType::f32), spec),
                    HasSubstr("a device step word for the noise needs a CUDA input"));
}
