// HALO's CUDA kernels (cuda/kernels/halo.cu) and pipeline against the CPU reference (src/grad/halo_quant.cpp,
// src/grad/pipeline_halo.cpp): the quantiser's codes and scales bit for bit for every rotation order (K = 1 and
// every Paley order, padded sizes, Llama's 4096 and 14336), input dtype and a non-contiguous input; rotations
// bit for bit; the int8 products and the whole int8 pipeline bit for bit (the int8 GEMM is exact and every other
// step is one fixed f32 sequence), the fp8 pipeline within fp8 GEMM accumulation tolerance; and a forward +
// backward recorded into a step graph (no host synchronisation) equal to the eager run; the int8 pipeline again at
// sizes the fast row kernels and the wide transposes take (cuda/kernels/halo_fast.cu, halo_transpose.cu); rows
// holding a NaN; rows of 2048 to 16384 through the square kernels (cuda/kernels/halo_square.cu).
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cuda/kernels/halo.cuh"  // halo_square_launches
#include "hadatrain/cuda/graph.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/scalar_types.h"

using namespace ht;
using namespace ht::grad;
using test::kCuda;

namespace {

std::string same_codes(const HaloQuantized& gpu, const HaloQuantized& cpu) {
  std::string msg = test::compare_bits(gpu.codes, cpu.codes);
  if (!msg.empty()) return "codes: " + msg;
  msg = test::compare_bits(gpu.scale, cpu.scale);
  return msg.empty() ? "" : "scale: " + msg;
}

// Whether the square row kernels take their rows in this process (test_gpu_halo_no_square sets
// HADATRAIN_HALO_SQUARE=0, the one value that turns them off).
bool square_kernels_on() {
  const char* v = std::getenv("HADATRAIN_HALO_SQUARE");
  return !(v != nullptr && std::string(v) == "0");
}

HaloOptions opts(int level, Carrier c) {
  HaloOptions o;
  o.level = level;
  o.carrier = c;
  return o;
}

}  // namespace

TEST_CASE("halo_quantize on CUDA gives the CPU's codes and scales bit for bit", "[gpu][halo]") {
  struct Case {
    int64_t R, C;
    bool rotate;
  };
  const std::vector<Case> cases = {{5, 7, false},   {33, 24, true},  {3, 100, true},    {9, 60, true},
                                   {4, 352, true},  {2, 3000, true}, {17, 4096, true},  {3, 14336, true},
                                   {2, 36 * 64, true}, {2, 20 * 32, true}, {1300, 40, false}, {3, 32768, true}};
  uint64_t seed = 1;
  for (const Case& c : cases)
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (Carrier carrier : {Carrier::int8, Carrier::fp8}) {
        const Tensor x = test::random_input({c.R, c.C}, seed++, dt, -3.0, 3.0);
        const HaloRotation rot = c.rotate ? halo_rotation_size(c.C) : HaloRotation{};
        INFO("(" << c.R << ", " << c.C << ") " << dtype_name(dt) << (carrier == Carrier::int8 ? " int8" : " fp8")
                 << " rotation " << rot.n << " K " << rot.k);
        const HaloQuantized cpu = halo_quantize(x, carrier, rot);
        const HaloQuantized gpu = halo_quantize(x.to(kCuda), carrier, rot);
        CHECK(same_codes(gpu, cpu) == "");
      }
  // every rotation the fast row kernels take (cuda/kernels/halo_fast.cu: power-of-two part P >= 512): each order K,
  // phase B with one pass of 1 to 4 stages and with two passes, more rows than the grid has CTAs (grid-stride and
  // one atomic max per CTA), padded rows whose vector loads stop at C, and an odd C (element loads)
  // Rows whose bytes are a multiple of 16 (from a 16-byte aligned start) and fit beside the rotated row are staged
  // in shared memory a row ahead (Note [HALO row prefetch]): (2500, 1024) and (1500, 4096) give every CTA two or
  // three staged rows in turn, 4001 and 30000 (f32) are read from global memory directly
  const std::vector<Case> fast_cases = {{1100, 512, true}, {3, 4000, true},  {2, 4001, true},  {2, 6000, true},
                                        {2, 18000, true},  {2, 20000, true}, {1, 22000, true}, {1, 30000, true},
                                        {2, 8192, true},   {2, 16384, true}, {70, 2048, true}, {2500, 1024, true},
                                        {1500, 4096, true}};
  for (const Case& c : fast_cases)
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (Carrier carrier : {Carrier::int8, Carrier::fp8}) {
        const Tensor x = test::random_input({c.R, c.C}, seed++, dt, -3.0, 3.0);
        const HaloRotation rot = halo_rotation_size(c.C);
        INFO("fast rows (" << c.R << ", " << c.C << ") " << dtype_name(dt)
                           << (carrier == Carrier::int8 ? " int8" : " fp8") << " rotation " << rot.n << " K " << rot.k);
        CHECK(same_codes(halo_quantize(x.to(kCuda), carrier, rot), halo_quantize(x, carrier, rot)) == "");
      }
  // an input whose data starts 2 bytes past a 16-byte boundary (contiguous, so the glue passes it as it is): the
  // fast kernel's vector loads must not be used
  {
    const Tensor flat = test::random_input({2 * 4096 + 1}, 98, DType::bf16);
    const Tensor cpu_x = reshape(flat.narrow(0, 1, 2 * 4096), {2, 4096});
    const Tensor gpu_x = reshape(flat.to(kCuda).narrow(0, 1, 2 * 4096), {2, 4096});
    REQUIRE(gpu_x.is_contiguous());
    const HaloRotation rot = halo_rotation_size(4096);
    CHECK(same_codes(halo_quantize(gpu_x, Carrier::fp8, rot), halo_quantize(cpu_x, Carrier::fp8, rot)) == "");
    CHECK(same_codes(halo_quantize(gpu_x, Carrier::int8, {}), halo_quantize(cpu_x, Carrier::int8, {})) == "");
  }
  // a transposed (non-contiguous) input, as level 2 quantises g_yᵀ
  const Tensor g = test::random_input({24, 10}, 99, DType::bf16);
  const HaloRotation rt = halo_rotation_size(24);
  CHECK(same_codes(halo_quantize(g.to(kCuda).transpose(0, 1), Carrier::int8, rt),
                   halo_quantize(g.transpose(0, 1), Carrier::int8, rt)) == "");
  // all zeros: zero codes and scale 0
  const HaloQuantized z = halo_quantize(zeros({4, 48}, {DType::f32, kCuda}), Carrier::fp8, halo_rotation_size(48));
  CHECK(z.scale.to(Device::cpu()).item() == 0.0);
  CHECK(max(abs(z.codes.to(Device::cpu()).to(DType::f32))).item() == 0.0);
}

TEST_CASE("the fp8 quantiser on CUDA encodes ties, subnormals, signed zeros and the maximum as the CPU does",
          "[gpu][halo]") {
  // max |x| = 448 makes the step r = 448 / 448 = 1, so the kernel converts x itself (the hardware e4m3 conversion of
  // halo_common.cuh's e4m3_code): every midpoint between neighbouring e4m3 values (ties to even, subnormal ones
  // included), the f32 values either side of each, both signs, ±0 and magnitudes below the smallest subnormal
  std::vector<float> v = {448.0f, -448.0f, 0.0f, -0.0f, 1e-30f, -1e-30f, std::ldexp(1.0f, -11), -std::ldexp(1.0f, -11)};
  for (uint8_t c = 0; c < 0x7E; ++c) {
    const float lo = detail::e4m3_bits_to_float(c), hi = detail::e4m3_bits_to_float(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact: both have at most 4 significant bits
    for (float t : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f), hi})
      for (float sign : {1.0f, -1.0f}) v.push_back(sign * t);
  }
  const Tensor x = from_vector(v, {1, static_cast<int64_t>(v.size())}, {DType::f32});
  const HaloQuantized cpu = halo_quantize(x, Carrier::fp8);
  REQUIRE(cpu.scale.item() == 1.0);
  CHECK(same_codes(halo_quantize(x.to(kCuda), Carrier::fp8), cpu) == "");
  // the same values through the rotating fast kernels' conversion (phase D): row k holds v[k] and zeros, so its
  // rotated values are exactly ±v[k] (the unnormalised Hadamard's entries are ±1) and the step is 1 again
  const int64_t n = 512, R = static_cast<int64_t>(v.size());
  std::vector<float> rows(static_cast<std::size_t>(R * n), 0.0f);
  for (int64_t k = 0; k < R; ++k) rows[static_cast<std::size_t>(k * n)] = v[static_cast<std::size_t>(k)];
  const Tensor xr = from_vector(rows, {R, n}, {DType::f32});
  const HaloQuantized cpu_r = halo_quantize(xr, Carrier::fp8, halo_rotation_size(n));
  REQUIRE(cpu_r.scale.item() == 1.0);
  CHECK(same_codes(halo_quantize(xr.to(kCuda), Carrier::fp8, halo_rotation_size(n)), cpu_r) == "");
}

TEST_CASE("halo_rotate on CUDA gives the CPU's values bit for bit", "[gpu][halo]") {
  uint64_t seed = 50;
  for (int64_t C : {16, 24, 100, 4096, 14336, 2000})
    for (HaloDirection d : {HaloDirection::forward, HaloDirection::inverse})
      for (DType out : {DType::f32, DType::bf16}) {
        const HaloRotation rot = halo_rotation_size(C);
        const Tensor x = test::random_input({3, C}, seed++, DType::bf16);
        const HaloRotate spec{rot, d, C - 1, 1.0f / static_cast<float>(rot.n), out};
        INFO("C " << C << " rotation " << rot.n << (d == HaloDirection::forward ? " forward " : " inverse ")
                  << dtype_name(out));
        CHECK(test::compare_bits(halo_rotate(x.to(kCuda), spec), halo_rotate(x, spec)) == "");
      }
}

TEST_CASE("halo_rotate on CUDA rounds to bf16 and keeps ties, subnormals, overflow, Inf and NaN as the CPU does",
          "[gpu][halo]") {
  // Note [HALO bf16 pairs] (cuda/kernels/halo_common.cuh): the rotation passes round their bf16 outputs in pairs
  // with cvt.rn.bf16x2.f32 and re-encode a NaN as the CPU's encoder does. Row k holds v[k] and zeros, so with mult 1
  // every rotated value is exactly v[k] (the unnormalised Hadamard's entries are ±1, and x + 0 = x), and the
  // conversion sees v[k] itself: the f32 values at, just below and just above the midpoint between neighbouring
  // bf16 values (ties to even), bf16 subnormals, the largest finite bf16 and the tie above it (rounds to Inf), ±0,
  // ±Inf and ±NaN (both come out as the canonical NaN: Note [HALO rotations], NaN; in the paired K×K stage of
  // K = 28 the first term may be a negated NaN). Through the square kernel (4096), the fast K = 1 kernel (512, all
  // columns and cropped: vector and element stores) and the fast K = 28 kernel (14336); bf16 and f32 outputs.
  std::vector<float> v = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN()};
  for (uint32_t c : {0x0000u, 0x0001u, 0x0002u, 0x003Fu, 0x0040u, 0x007Fu, 0x0080u, 0x0081u, 0x3F80u, 0x3F81u,
                     0x4000u, 0x7F00u, 0x7F7Eu, 0x7F7Fu})
    for (uint32_t low : {0x7FFFu, 0x8000u, 0x8001u})
      for (uint32_t sign : {0u, 0x80000000u}) v.push_back(detail::f32_from_bits(sign | c << 16 | low));
  for (int64_t n : {4096, 512, 14336}) {
    const int64_t R = static_cast<int64_t>(v.size());
    std::vector<float> rows(static_cast<std::size_t>(R * n), 0.0f);
    for (int64_t k = 0; k < R; ++k) rows[static_cast<std::size_t>(k * n)] = v[static_cast<std::size_t>(k)];
    const Tensor x = from_vector(rows, {R, n}, {DType::f32});
    const HaloRotation rot = halo_rotation_size(n);
    for (int64_t cols : {rot.n, rot.n - 3})
      for (DType out : {DType::bf16, DType::f32}) {
        INFO("n " << n << " K " << rot.k << " cols " << cols << " " << dtype_name(out));
        const HaloRotate spec{rot, HaloDirection::forward, cols, 1.0f, out};
        const int64_t before = kernels::halo_square_launches();
        const Tensor cpu = halo_rotate(x, spec);
        CHECK(test::compare_bits(halo_rotate(x.to(kCuda), spec), cpu) == "");
        const bool square = n == 4096 && cols == n && square_kernels_on();
        CHECK(kernels::halo_square_launches() - before == (square ? 1 : 0));
      }
  }
}

TEST_CASE("halo_rotate on CUDA at the fast kernels' sizes gives the CPU's values bit for bit", "[gpu][halo]") {
  // power-of-two parts >= 512 (cuda/kernels/halo_fast.cu), every order, both directions, f32 and bf16 inputs and
  // outputs, all columns kept (vector stores) or cropped to an odd count (element stores)
  uint64_t seed = 150;
  for (int64_t C : {512, 4000, 6000, 16384, 18000, 20000, 22000, 30000, 32768})
    for (HaloDirection d : {HaloDirection::forward, HaloDirection::inverse})
      for (DType in : {DType::f32, DType::bf16})
        for (DType out : {DType::f32, DType::bf16}) {
          const HaloRotation rot = halo_rotation_size(C);
          const Tensor x = test::random_input({3, C}, seed++, in);
          for (int64_t cols : {rot.n, C - 3}) {
            const HaloRotate spec{rot, d, cols, 1.0f / static_cast<float>(rot.n), out};
            INFO("C " << C << " rotation " << rot.n << " K " << rot.k
                      << (d == HaloDirection::forward ? " forward " : " inverse ") << dtype_name(in) << " -> "
                      << dtype_name(out) << " cols " << cols);
            CHECK(test::compare_bits(halo_rotate(x.to(kCuda), spec), halo_rotate(x, spec)) == "");
          }
        }
}

TEST_CASE("halo_absmax and halo_quantize_with_absmax on CUDA at the fast kernels' sizes equal the CPU's",
          "[gpu][halo]") {
  uint64_t seed = 250;
  for (int64_t C : {4096, 14336, 30000})
    for (Carrier c : {Carrier::int8, Carrier::fp8}) {
      const HaloRotation rot = halo_rotation_size(C);
      const Tensor x = test::random_input({5, C}, seed++, DType::bf16, -2.0, 2.0);
      INFO("C " << C << (c == Carrier::int8 ? " int8" : " fp8"));
      const Tensor m_gpu = halo_absmax(x.to(kCuda), rot), m_cpu = halo_absmax(x, rot);
      CHECK(test::compare_bits(m_gpu, m_cpu) == "");
      // a larger shared absmax (HQ-FSDP's max over ranks): codes use fewer levels, the same on both sides
      const Tensor big = full({1}, 3.0 * m_cpu.item(), {DType::f32});
      CHECK(same_codes(halo_quantize_with_absmax(x.to(kCuda), c, rot, big.to(kCuda)),
                       halo_quantize_with_absmax(x, c, rot, big)) == "");
    }
}

TEST_CASE("rows of 2048 to 16384 go through the square kernels and give the CPU's codes and values bit for bit",
          "[gpu][halo]") {
  // Note [HALO square rows] (cuda/kernels/halo_square.cu), every row size (S = 32, 64, 128, 256 threads: no shuffle
  // stage, none, one, two): the absmax and quantise passes with both carriers, paired and not, and the rotation to f32
  // and bf16, every input dtype, on one row and on a few; in bf16 also more rows than the persistent grid has CTAs.
  // The launch counter shows which kernels ran (a fallback to the fast row kernels would hide a fault). Rows that
  // keep fewer columns or start off a 16-byte boundary take the fast row kernels (the tests above).
  // test_gpu_halo_no_square runs this with HADATRAIN_HALO_SQUARE=0: the same bits from the fast row kernels
  const int64_t per_pass = square_kernels_on() ? 1 : 0;
  uint64_t seed = 700;
  for (int64_t n : {2048, 4096, 8192, 16384}) {
    const HaloRotation rot = halo_rotation_size(n);
    REQUIRE(rot.n == n);
    REQUIRE(rot.k == 1);
    const int64_t many = 8'000'000 / n;  // more rows than CTAs fit on an H100 or H200 at every n
    for (int64_t R : {int64_t{1}, int64_t{3}, many})
      for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
        if (R == many && dt != DType::bf16) continue;
        const Tensor x = test::random_input({R, n}, seed++, dt, -3.0, 3.0);
        const Tensor xg = x.to(kCuda);
        for (Carrier c : {Carrier::int8, Carrier::fp8}) {
          INFO("quantise (" << R << ", " << n << ") " << dtype_name(dt) << (c == Carrier::int8 ? " int8" : " fp8"));
          int64_t before = kernels::halo_square_launches();
          const HaloQuantized cpu = halo_quantize(x, c, rot);
          CHECK(same_codes(halo_quantize(xg, c, rot), cpu) == "");
          CHECK(kernels::halo_square_launches() - before == 2 * per_pass);  // the absmax and the quantise pass
          before = kernels::halo_square_launches();
          const auto [rotated, plain] = halo_quantize_pair(xg, c, rot);
          CHECK(same_codes(rotated, cpu) == "");
          CHECK(same_codes(plain, halo_quantize(x, c)) == "");
          CHECK(kernels::halo_square_launches() - before == 2 * per_pass);
        }
        for (HaloDirection d : {HaloDirection::forward, HaloDirection::inverse})
          for (DType out : {DType::f32, DType::bf16}) {
            if (R == many && (d == HaloDirection::forward) != (out == DType::bf16)) continue;
            INFO("rotate (" << R << ", " << n << ") " << dtype_name(dt) << " -> " << dtype_name(out));
            const HaloRotate spec{rot, d, n, 1.0f / static_cast<float>(n), out};
            const int64_t before = kernels::halo_square_launches();
            CHECK(test::compare_bits(halo_rotate(xg, spec), halo_rotate(x, spec)) == "");
            CHECK(kernels::halo_square_launches() - before == per_pass);
          }
      }
    // rows holding a NaN (one of them negative): the absmax skips it, the row rotates to NaNs, both carriers encode
    // them as the CPU does (Note [HALO rotations], NaN)
    for (DType dt : {DType::bf16, DType::f32})
      for (Carrier c : {Carrier::int8, Carrier::fp8}) {
        Tensor x = test::random_input({6, n}, seed++, DType::f32, -3.0, 3.0);
        for (int64_t at : {2 * n + 5, 4 * n + n / 2 + 1, 5 * n + n - 1})
          x.data<float>()[at] = std::numeric_limits<float>::quiet_NaN();
        x.data<float>()[4 * n + n / 2 + 1] = -std::numeric_limits<float>::quiet_NaN();
        x = x.to(dt);
        INFO("NaN rows (6, " << n << ") " << dtype_name(dt) << (c == Carrier::int8 ? " int8" : " fp8"));
        const int64_t before = kernels::halo_square_launches();
        CHECK(same_codes(halo_quantize(x.to(kCuda), c, rot), halo_quantize(x, c, rot)) == "");
        CHECK(kernels::halo_square_launches() - before == 2 * per_pass);
      }
  }
}

TEST_CASE("halo_quantize_pair on CUDA gives the CPU's rotated and unrotated codes and scales bit for bit",
          "[gpu][halo]") {
  // the paired fast kernels (Note [HALO paired quantiser]) at P >= 512, padded and odd C, more rows than CTAs, and
  // the two-call fallback below P = 512
  struct Case {
    int64_t R, C;
  };
  uint64_t seed = 350;
  for (const Case& c : std::vector<Case>{{6, 8192}, {3, 14336}, {5, 4000}, {3, 4001}, {1100, 512}, {4, 100}})
    for (DType dt : {DType::bf16, DType::f32})
      for (Carrier carrier : {Carrier::int8, Carrier::fp8}) {
        const Tensor x = test::random_input({c.R, c.C}, seed++, dt, -3.0, 3.0);
        const HaloRotation rot = halo_rotation_size(c.C);
        INFO("(" << c.R << ", " << c.C << ") " << dtype_name(dt) << (carrier == Carrier::int8 ? " int8" : " fp8")
                 << " rotation " << rot.n << " K " << rot.k);
        const auto [rotated, plain] = halo_quantize_pair(x.to(kCuda), carrier, rot);
        CHECK(same_codes(rotated, halo_quantize(x, carrier, rot)) == "");
        CHECK(same_codes(plain, halo_quantize(x, carrier)) == "");
      }
}

TEST_CASE("the quantisers on CUDA give the CPU's codes for rows holding a NaN", "[gpu][halo]") {
  // Note [HALO codes by four]: a group of four values holding a NaN leaves the paired conversion for e4m3_code; the
  // absmax skips NaNs on both sides (fmax), a NaN row rotates to NaNs, and both carriers encode them as the CPU does.
  // One NaN is negative: CUDA's arithmetic returns its canonical (positive) NaN for it, and the CPU reference
  // replaces its NaNs by that one (Note [HALO rotations], NaN), so the codes' signs agree.
  uint64_t seed = 470;
  for (DType dt : {DType::bf16, DType::f32})
    for (Carrier carrier : {Carrier::int8, Carrier::fp8}) {
      Tensor x = test::random_input({6, 8192}, seed++, DType::f32, -3.0, 3.0);
      for (int64_t at : {int64_t{2} * 8192 + 5, int64_t{4} * 8192 + 4099, int64_t{4} * 8192 + 8191})
        x.data<float>()[at] = std::numeric_limits<float>::quiet_NaN();
      x.data<float>()[int64_t{2} * 8192 + 5] = -std::numeric_limits<float>::quiet_NaN();
      x = x.to(dt);
      const HaloRotation rot = halo_rotation_size(8192);
      INFO(dtype_name(dt) << (carrier == Carrier::int8 ? " int8" : " fp8"));
      const auto [rotated, plain] = halo_quantize_pair(x.to(kCuda), carrier, rot);
      CHECK(same_codes(rotated, halo_quantize(x, carrier, rot)) == "");
      CHECK(same_codes(plain, halo_quantize(x, carrier)) == "");
      CHECK(same_codes(halo_quantize(x.to(kCuda), carrier), halo_quantize(x, carrier)) == "");
      const auto [codes, codes_t] = halo_quantize_transposed(x.to(kCuda), carrier);
      const auto [codes_cpu, codes_t_cpu] = halo_quantize_transposed(x, carrier);
      CHECK(same_codes(codes, codes_cpu) == "");
      CHECK(test::compare_bits(codes_t, codes_t_cpu) == "");
    }
}

TEST_CASE("halo_transpose on CUDA gives the CPU's transpose for codes and bf16 of odd shapes", "[gpu][halo]") {
  for (DType dt : {DType::bf16, DType::f32}) {
    const Tensor x = test::random_input({70, 33}, 60, dt);
    CHECK(test::compare_bits(halo_transpose(x.to(kCuda)), halo_transpose(x)) == "");
  }
  const HaloQuantized q = halo_quantize(test::random_input({45, 97}, 61, DType::f32), Carrier::fp8);
  CHECK(test::compare_bits(halo_transpose(q.codes.to(kCuda)), halo_transpose(q.codes)) == "");
  // shapes the wide kernel takes (Note [HALO transposes] in cuda/kernels/halo_transpose.cu: multiples of 16 codes or
  // 8 bf16 values): whole and partial tiles, more tile rows than columns and the reverse
  for (auto [R, C] : {std::pair<int64_t, int64_t>{256, 384}, {144, 272}, {16, 16}, {400, 48}, {32, 1040}}) {
    INFO("wide (" << R << ", " << C << ")");
    const HaloQuantized qw = halo_quantize(test::random_input({R, C}, 70 + R, DType::f32), Carrier::fp8);
    CHECK(test::compare_bits(halo_transpose(qw.codes.to(kCuda)), halo_transpose(qw.codes)) == "");
    const Tensor b = test::random_input({R / 2 + 8, C / 2}, 71 + R, DType::bf16);
    CHECK(test::compare_bits(halo_transpose(b.to(kCuda)), halo_transpose(b)) == "");
  }
  // shapes the word kernel takes: whole and partial 64×64 tiles
  for (auto [R, C] : {std::pair<int64_t, int64_t>{136, 200}, {64, 64}, {4, 260}, {300, 8}}) {
    INFO("(" << R << ", " << C << ")");
    const HaloQuantized qw = halo_quantize(test::random_input({R, C}, 62 + R, DType::f32), Carrier::int8);
    CHECK(test::compare_bits(halo_transpose(qw.codes.to(kCuda)), halo_transpose(qw.codes)) == "");
    const Tensor b = test::random_input({R, C + 2}, 63 + R, DType::bf16);
    CHECK(test::compare_bits(halo_transpose(b.to(kCuda)), halo_transpose(b)) == "");
  }
}

// Note [HALO fp8 product tolerance]
// The CPU and CUDA fp8 products start from the same codes and scales (the quantiser is bit-identical, tested
// above; here the CPU's codes are copied to the device, so only the product differs). Each product p_k = a_k·b_k
// of two e4m3 codes (4 significant bits each) is exact. The CPU sums them in double (exact: |Σ| < 2^25 on a grid
// of 2^-18 needs at most 43 bits) and multiplies by s = s_a·(s_b·mult) once, rounding to f32. cuBLASLt
// (CUBLAS_COMPUTE_32F, fast accumulation off) sums on the tensor cores, which add a group of products by
// aligning them to the largest exponent in the addition and keeping a limited number of fraction bits (about
// 14 measured on Hopper, DeepSeek-V3 report §3.3.2; we assume only f = 13), promoting the partial sums to f32
// between groups. Every magnitude in any partial addition is at most P = Σ_k |p_k|, so each of the K
// products loses less than 2^(1−f)·P, and the f32 promotions (at most K of them) less than 2^-24·P each:
//   |gpu − exact| <= s·K·(2^-12 + 2^-24)·P, plus the f32 rounding of s and of the scaled result (2^-22·|y|).
// The bf16 output rounds each side once (one bf16 ulp <= 2^-7·|y| apart at most). The observed differences are
// far below this bound (the sums do not line up adversarially); what it catches is a wrong operand, layout or
// scale beyond a few percent. Scale order is checked tightly by the second case: integer codes of magnitude <= 4
// give products and sums that every accumulator holds exactly, so only the three f32 roundings of the scales
// and the result remain (4 f32 ulps).
namespace {

std::string fp8_product_within_bound(const Tensor& gpu, const Tensor& cpu, const Tensor& a, const Tensor& b,
                                     double s) {
  const Tensor g = gpu.to(Device::cpu()).to(DType::f64).contiguous(), c = cpu.to(DType::f64).contiguous();
  const Tensor af = a.to(DType::f64).contiguous(), bf = b.to(DType::f64).contiguous();
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  const double out_rel = gpu.dtype() == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -22);
  int bad = 0;
  std::string msg;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double p = 0.0;
      for (int64_t k = 0; k < K; ++k) p += std::fabs(af.data<double>()[i * K + k] * bf.data<double>()[j * K + k]);
      const double y = c.data<double>()[i * N + j], v = g.data<double>()[i * N + j];
      const double bound = s * static_cast<double>(K) * (std::ldexp(1.0, -12) + std::ldexp(1.0, -24)) * p +
                           out_rel * std::fabs(y) + 1e-30;
      if (!(std::fabs(v - y) <= bound) && ++bad <= 3)
        msg += fmt::format("[{}, {}] gpu {} cpu {} bound {}\n", i, j, v, y, bound);
    }
  return bad == 0 ? "" : fmt::format("{} elements beyond the accumulation bound:\n{}", bad, msg);
}

}  // namespace

TEST_CASE("halo_product on CUDA: int8 bit for bit, fp8 to accumulation tolerance", "[gpu][halo]") {
  for (Carrier c : {Carrier::int8, Carrier::fp8}) {
    const Tensor a = test::random_input({70, 96}, 7, DType::f32), b = test::random_input({33, 96}, 8, DType::f32);
    const HaloQuantized qa = halo_quantize(a, c), qb = halo_quantize(b, c);
    for (DType out : {DType::f32, DType::bf16})
      for (Fp8Accumulation acc : {Fp8Accumulation::precise, Fp8Accumulation::fast}) {
        if (c == Carrier::int8 && acc == Fp8Accumulation::fast) continue;
        INFO((c == Carrier::int8 ? "int8 " : "fp8 ") << dtype_name(out)
                                                      << (acc == Fp8Accumulation::fast ? " fast accumulation" : ""));
        const Tensor cpu = halo_product(qa.codes, qb.codes, qa.scale, qb.scale, {0.125f, out, acc});
        const Tensor gpu = halo_product(qa.codes.to(kCuda), qb.codes.to(kCuda), qa.scale.to(kCuda),
                                        qb.scale.to(kCuda), {0.125f, out, acc});
        if (c == Carrier::int8) {
          CHECK(test::compare_bits(gpu, cpu) == "");
        } else {
          // fast accumulation keeps the tensor cores' partial sums in their narrower accumulator along all of K,
          // which Note [HALO fp8 product tolerance]'s bound (K·2^-12 of Σ|a_k·b_k| per element) also covers
          const double s = qa.scale.item() * qb.scale.item() * 0.125;
          CHECK(fp8_product_within_bound(gpu, cpu, qa.codes, qb.codes, s) == "");
        }
      }
  }
  // fp8 integer codes in [-4, 4]: exact sums on both sides, so only the scales' f32 roundings differ
  const Tensor ia = test::random_input({40, 64}, 21, DType::i8, -4, 4).to(DType::f32).to(DType::f8e4m3);
  const Tensor ib = test::random_input({24, 64}, 22, DType::i8, -4, 4).to(DType::f32).to(DType::f8e4m3);
  const Tensor sa = full({1}, 0.0371, {DType::f32}), sb = full({1}, 0.00913, {DType::f32});
  const Tensor cpu = halo_product(ia, ib, sa, sb, {0.25f, DType::f32});
  const Tensor gpu = halo_product(ia.to(kCuda), ib.to(kCuda), sa.to(kCuda), sb.to(kCuda), {0.25f, DType::f32});
  CHECK(test::compare_to_cpu(gpu, cpu, {4 * 0x1p-23, 0.0}) == "");
}

TEST_CASE("the halo pipeline on CUDA equals the CPU's (int8 bit for bit) and records into a step graph",
          "[gpu][halo]") {
  const int64_t B = 2, L = 12, I = 56, O = 40;  // I: 28·2; T = 24 tokens (level 2: 24 = 12·2)
  const Tensor x = test::random_input({B, L, I}, 11, DType::bf16), w = test::random_input({O, I}, 12, DType::bf16, -0.2, 0.2);
  const Tensor g = test::random_input({B, L, O}, 13, DType::bf16, -0.01, 0.01);
  const Tensor bias = test::random_input({O}, 14, DType::bf16);
  for (int level : {0, 1, 2})
    for (int form : {0, 1, 2}) {  // int8; fp8 (fast accumulation, the default); fp8 with precise accumulation
      const Carrier c = form == 0 ? Carrier::int8 : Carrier::fp8;
      HaloOptions o = opts(level, c);
      if (form == 2) o.fp8_accumulation = Fp8Accumulation::precise;
      INFO("level " << level << (c == Carrier::int8 ? " int8" : " fp8") << (form == 2 ? ", precise accumulation" : ""));
      ProductInfo info;
      info.bias = bias;
      auto cpu = make_halo_pipeline(o);
      ForwardResult fc = cpu->forward(x, w, info, NoiseKey{}, SaveForBackward::yes);
      const Grads gc = cpu->backward(*fc.saved, g, {true, true});

      ProductInfo ginfo;
      ginfo.bias = bias.to(kCuda);
      const Tensor xg = x.to(kCuda), wg = w.to(kCuda), gg = g.to(kCuda);
      // The eager run goes on the graph's stream, as cuda/graph.h asks: it creates what is made once per stream
      // (the cuBLAS workspace, cuda::cublas_workspace), which must exist before recording.
      cuda::StepGraph graph(0);
      cuda::StreamGuard on(graph.stream(), 0);
      auto gpu = make_halo_pipeline(o);
      ForwardResult fg = gpu->forward(xg, wg, ginfo, NoiseKey{}, SaveForBackward::yes);
      const Grads gr = gpu->backward(*fg.saved, gg, {true, true});
      if (c == Carrier::int8) {
        CHECK(test::compare_bits(fg.y, fc.y) == "");
        CHECK(test::compare_bits(gr.x, gc.x) == "");
        CHECK(test::compare_bits(gr.w, gc.w) == "");
      } else {
        // y is the fp8 product (accumulated in another order than the CPU's) rounded to bf16, then the bias
        // added and rounded again. An element whose bias cancels most of its product keeps the product's
        // rounding step: one bf16 ulp of |product| < 2 (2^-7) absolute, seen on the H200 at levels 1 and 2
        // (-0.1640625 against -0.171875); a wrong scale or code is off by far more.
        CHECK(test::compare_to_cpu(fg.y, fc.y, {0x1p-6, 0x1p-7}) == "");
        CHECK(test::compare_to_cpu(gr.x, gc.x) == "");
        CHECK(test::compare_to_cpu(gr.w, gc.w) == "");
      }

      // the same forward + backward recorded into a step graph and replayed: no host synchronisation inside
      Tensor y_out = empty_like(fg.y), gx_out = empty_like(gr.x), gw_out = empty_like(gr.w);
      const std::string why = graph.record([&] {
        ForwardResult f = gpu->forward(xg, wg, ginfo, NoiseKey{}, SaveForBackward::yes);
        const Grads gg2 = gpu->backward(*f.saved, gg, {true, true});
        copy_(y_out, f.y);
        copy_(gx_out, gg2.x);
        copy_(gw_out, gg2.w);
      });
      REQUIRE(why == "");
      graph.replay();
      cudaStreamSynchronize(graph.stream());
      CHECK(test::compare_bits(y_out, fg.y.to(Device::cpu())) == "");
      CHECK(test::compare_bits(gx_out, gr.x.to(Device::cpu())) == "");
      CHECK(test::compare_bits(gw_out, gr.w.to(Device::cpu())) == "");
    }
}

TEST_CASE("the int8 halo pipeline on CUDA at the fast kernels' sizes equals the CPU's bit for bit", "[gpu][halo]") {
  // T = 512 tokens and I = 512: every rotation, quantiser and rotation back goes through the fast row kernels with
  // staged rows (Note [HALO row prefetch]) and every transpose through the wide kernel (Note [HALO transposes])
  const int64_t B = 2, L = 256, I = 512, O = 384;
  const Tensor x = test::random_input({B, L, I}, 31, DType::bf16);
  const Tensor w = test::random_input({O, I}, 32, DType::bf16, -0.2, 0.2);
  const Tensor g = test::random_input({B, L, O}, 33, DType::bf16, -0.01, 0.01);
  for (int level : {0, 1, 2}) {
    INFO("level " << level);
    auto cpu = make_halo_pipeline(opts(level, Carrier::int8));
    ForwardResult fc = cpu->forward(x, w, ProductInfo{}, NoiseKey{}, SaveForBackward::yes);
    const Grads gc = cpu->backward(*fc.saved, g, {true, true});
    auto gpu = make_halo_pipeline(opts(level, Carrier::int8));
    ForwardResult fg = gpu->forward(x.to(kCuda), w.to(kCuda), ProductInfo{}, NoiseKey{}, SaveForBackward::yes);
    const Grads gr = gpu->backward(*fg.saved, g.to(kCuda), {true, true});
    CHECK(test::compare_bits(fg.y, fc.y) == "");
    CHECK(test::compare_bits(gr.x, gc.x) == "");
    CHECK(test::compare_bits(gr.w, gc.w) == "");
  }
}

TEST_CASE("halo_quantize_transposed on CUDA gives the CPU's codes, scale and transposed codes bit for bit",
          "[gpu][halo]") {
  // the fused kernel (Note [HALO transposed codes]: rows and columns multiples of 16, whole and partial 128×128
  // tiles) and the fallback (other shapes, an input starting 2 bytes past a 16-byte boundary)
  struct Case {
    int64_t R, C;
  };
  uint64_t seed = 450;
  for (const Case& c : std::vector<Case>{{256, 384}, {144, 272}, {16, 16}, {400, 48}, {32, 1040}, {24, 40}, {7, 9}})
    for (DType dt : {DType::bf16, DType::f32, DType::f16})
      for (Carrier carrier : {Carrier::int8, Carrier::fp8}) {
        const Tensor x = test::random_input({c.R, c.C}, seed++, dt, -3.0, 3.0);
        INFO("(" << c.R << ", " << c.C << ") " << dtype_name(dt) << (carrier == Carrier::int8 ? " int8" : " fp8"));
        const auto [gpu, gpu_t] = halo_quantize_transposed(x.to(kCuda), carrier);
        const auto [cpu, cpu_t] = halo_quantize_transposed(x, carrier);
        CHECK(same_codes(gpu, cpu) == "");
        CHECK(same_codes(gpu, halo_quantize(x, carrier)) == "");
        CHECK(test::compare_bits(gpu_t, cpu_t) == "");
      }
  const Tensor flat = test::random_input({64 * 32 + 1}, 460, DType::bf16);
  const Tensor cpu_x = reshape(flat.narrow(0, 1, 64 * 32), {64, 32});
  const Tensor gpu_x = reshape(flat.to(kCuda).narrow(0, 1, 64 * 32), {64, 32});
  const auto [gpu, gpu_t] = halo_quantize_transposed(gpu_x, Carrier::fp8);
  const auto [cpu, cpu_t] = halo_quantize_transposed(cpu_x, Carrier::fp8);
  CHECK(same_codes(gpu, cpu) == "");
  CHECK(test::compare_bits(gpu_t, cpu_t) == "");
}
