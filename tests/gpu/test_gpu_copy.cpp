// CUDA copies and conversions against the CPU reference, bit for bit: every dtype pair (special values
// included), all 256 fp8 codes, random float bit patterns into fp8/bf16/f16, strided and broadcast copies,
// fill_, the factories, and packed int4 transfers.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/tensor/philox.h"

using namespace ht;

namespace {

// Values that exercise every conversion rule: NaN of both signs, infinities, signed zeros, ties, integer
// range edges, fp8/f16 overflow and subnormal ranges, and values beyond 2^53.
std::vector<double> special_values() {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = {nan,   -nan,     inf,      -inf,     0.0,      -0.0,      0.5,      -0.5,     1.5,
                           2.5,   -2.5,     127.0,    127.5,    128.0,    -128.0,    -129.0,   255.0,    255.9,
                           256.0, -1.0,     65504.0,  65520.0,  70000.0,  448.0,     449.0,    464.0,    480.0,
                           1e5,   57344.0,  61440.0,  1e10,     -1e10,    3e38,     1e300,    -1e300,   1e-3,
                           1e-5,  2e-7,     -6e-8,    1e-40,    1e-320,   2147483647.0, 2147483648.0, -2147483649.0,
                           9007199254740993.0, 1.0 / 3.0, -7.0 / 3.0};
  return v;
}

// Random doubles over many scales (sign, mantissa and exponent all vary).
std::vector<double> random_values(std::size_t n, uint64_t seed) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(uniform_from_word(philox_word(seed, 0, i))) * 2.0 - 1.0;
    const int e = static_cast<int>(philox_word(seed, 1, i) % 48) - 24;  // 2^-24 .. 2^23
    v[i] = std::ldexp(u, e);
  }
  return v;
}

// A host tensor of `dt` whose raw bytes are `bytes`.
Tensor from_bytes(const std::vector<uint8_t>& bytes, DType dt) {
  Tensor t = empty({static_cast<int64_t>(bytes.size() / itemsize(dt))}, {dt, Device::cpu()});
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

TEST_CASE("conversions between every pair of dtypes match the CPU bit for bit", "[gpu][copy]") {
  std::vector<double> values = special_values();
  const auto rnd = random_values(4000, 11);
  values.insert(values.end(), rnd.begin(), rnd.end());
  const Tensor base = from_vector(values, {static_cast<int64_t>(values.size())}, {DType::f64});
  for (DType s : test::all_dtypes()) {
    const Tensor src = base.to(s);  // the CPU decides what the source holds
    const Tensor csrc = src.to(test::kCuda);
    for (DType d : test::all_dtypes()) {
      Tensor actual;
      {
        test::PoisonGuard poison;
        actual = csrc.to(d);
      }
      INFO(dtype_name(s) << " -> " << dtype_name(d));
      CHECK(test::compare_bits(actual, src.to(d)) == "");
    }
  }
}

TEST_CASE("strided, broadcast and cross-dtype copy_ into CUDA views", "[gpu][copy]") {
  uint64_t seed = 40;
  for (DType s : test::all_dtypes()) {
    for (DType d : {DType::f32, DType::bf16, DType::i64, DType::f8e5m2, DType::b8, s}) {
      INFO(dtype_name(s) << " -> " << dtype_name(d));
      const Tensor src = test::random_input({6, 9}, ++seed, s, -300, 300);
      // Destination: a step-2 column slice of a (9, 12) base, transposed to (6, 9); the rest of the base
      // must stay as it was.
      const Tensor dst_base = test::random_input({9, 12}, ++seed, d, -5, 5);
      const Tensor cdst_base = dst_base.to(test::kCuda);
      {
        NoGradGuard ng;
        copy_(slice(dst_base, 1, 0, 12, 2).narrow(1, 0, 6).transpose(0, 1), src);
        copy_(slice(cdst_base, 1, 0, 12, 2).narrow(1, 0, 6).transpose(0, 1), src.to(test::kCuda));  // device -> device
      }
      CHECK(test::compare_bits(cdst_base, dst_base) == "");
      // host source straight into the CUDA view (transfer, then the copy kernel)
      const Tensor cdst2 = test::random_input({9, 12}, seed, d, -5, 5).to(test::kCuda);
      copy_(slice(cdst2, 1, 0, 12, 2).narrow(1, 0, 6).transpose(0, 1), src);
      CHECK(test::compare_bits(cdst2, dst_base) == "");
      // broadcast source (1, 9) -> (6, 9), and a non-contiguous CUDA source back to the host
      const Tensor row = test::random_input({1, 9}, ++seed, s, -300, 300);
      Tensor bdst = empty({6, 9}, {d, test::kCuda});
      copy_(bdst, row.to(test::kCuda));
      CHECK(test::compare_bits(bdst, row.expand({6, 9}).to(d)) == "");
      Tensor host_dst = empty({9, 6}, {d, Device::cpu()});
      copy_(host_dst, src.to(test::kCuda).transpose(0, 1));
      CHECK(test::compare_bits(host_dst.to(test::kCuda), src.transpose(0, 1).to(d)) == "");
    }
  }
  // contiguous() of large odd-sized permuted tensors
  for (DType dt : {DType::f32, DType::bf16, DType::i8, DType::f64}) {
    const Tensor x = test::random_input({101, 3, 3301}, ++seed, dt, -100, 100);
    Tensor actual;
    {
      test::PoisonGuard poison;
      actual = x.to(test::kCuda).permute({2, 0, 1}).contiguous();
    }
    CHECK(test::compare_bits(actual, x.permute({2, 0, 1}).contiguous()) == "");
  }
}

TEST_CASE("fp8 decodes all 256 codes exactly like the CPU", "[gpu][copy][fp8]") {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[static_cast<std::size_t>(i)] = static_cast<uint8_t>(i);
  for (DType f8 : test::kFp8DTypes) {
    const Tensor host = from_bytes(codes, f8);
    const Tensor dev = host.to(test::kCuda);
    CHECK(test::raw_bytes(dev) == codes);
    for (DType d : test::all_dtypes()) {
      INFO(dtype_name(f8) << " -> " << dtype_name(d));
      CHECK(test::compare_bits(dev.to(d), host.to(d)) == "");
    }
    // and encoding the decoded values gives the codes back (NaN codes map to the canonical NaN code)
    for (DType via : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      INFO(dtype_name(f8) << " round trip through " << dtype_name(via));
      CHECK(test::compare_bits(dev.to(via).to(f8), host.to(via).to(f8)) == "");
    }
  }
}

TEST_CASE("random float bit patterns convert to fp8, bf16 and f16 exactly like the CPU", "[gpu][copy][fp8]") {
  const std::size_t n = 1000003;
  std::vector<uint8_t> bytes(n * 4);
  for (std::size_t i = 0; i < n; ++i) {
    uint32_t w = philox_word(77, 0, i);
    // Half of the words: any bit pattern (NaN, Inf, subnormal, huge). The other half: values near the
    // fp8 range, including exact midpoints between neighbouring codes (ties to even).
    if (i % 2 == 1) {
      const float mag = std::ldexp(1.0f + static_cast<float>(w & 0xFFFu) / 4096.0f, static_cast<int>((w >> 12) % 40) - 24);
      const float f = (w >> 31) ? -mag : mag;
      std::memcpy(&w, &f, 4);
      if ((w >> 16) % 5 == 0) w &= 0xFFF80000u | (1u << 18);  // a tie for 3- and 4-bit mantissas
    }
    std::memcpy(&bytes[i * 4], &w, 4);
  }
  const Tensor host = from_bytes(bytes, DType::f32);
  const Tensor dev = host.to(test::kCuda);
  for (DType d : {DType::f8e4m3, DType::f8e5m2, DType::bf16, DType::f16, DType::f64}) {
    Tensor actual;
    {
      test::PoisonGuard poison;
      actual = dev.to(d);
    }
    INFO("f32 bit patterns -> " << dtype_name(d));
    CHECK(test::compare_bits(actual, host.to(d)) == "");
  }
  // doubles into fp8 (rounded to float first, as on the CPU)
  const auto dv = random_values(n, 99);
  const Tensor hd = from_vector(dv, {static_cast<int64_t>(n)}, {DType::f64});
  for (DType d : test::kFp8DTypes) CHECK(test::compare_bits(hd.to(test::kCuda).to(d), hd.to(d)) == "");
}

TEST_CASE("fill_ writes exactly the view's elements in every dtype", "[gpu][copy]") {
  const double nan = std::nan("");
  uint64_t seed = 60;
  for (DType dt : test::all_dtypes()) {
    for (double value : {3.7, -1.25, 1e6, nan, 0.0}) {
      INFO(dtype_name(dt) << " fill " << value);
      const Tensor base = test::random_input({7, 10}, ++seed, dt, -9, 9);
      const Tensor cbase = base.to(test::kCuda);
      fill_(slice(base, 1, 1, 10, 3), value);
      fill_(slice(cbase, 1, 1, 10, 3), value);
      CHECK(test::compare_bits(cbase, base) == "");
      Tensor full_dev;
      {
        test::PoisonGuard poison;
        full_dev = full({1000003}, value, {dt, test::kCuda});
      }
      CHECK(test::compare_bits(full_dev, full({1000003}, value, {dt})) == "");
    }
  }
}

TEST_CASE("factories give the same values on CUDA as on the CPU", "[gpu][copy]") {
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i32}) {
    CHECK(test::compare_bits(zeros({13, 7}, {dt, test::kCuda}), zeros({13, 7}, {dt})) == "");
    CHECK(test::compare_bits(ones({5}, {dt, test::kCuda}), ones({5}, {dt})) == "");
    CHECK(test::compare_bits(arange(1001, {dt, test::kCuda}), arange(1001, {dt})) == "");
    Generator g1(5), g2(5);
    CHECK(test::compare_bits(rand({333}, g1, {dt, test::kCuda}), rand({333}, g2, {dt})) == "");
    CHECK(test::compare_bits(randn({333}, g1, {dt, test::kCuda}), randn({333}, g2, {dt})) == "");
  }
  CHECK(scalar_tensor(2.5, {DType::f32, test::kCuda}).item() == 2.5);
}

TEST_CASE("packed int4 moves between host and CUDA as whole buffers", "[gpu][copy]") {
  const Tensor vals = from_vector(std::vector<int64_t>{-8, -3, 0, 1, 7, 5, -1}, {7}, {DType::i64});
  const Tensor packed = vals.to(DType::i4x2);
  const Tensor dev = packed.to(test::kCuda);
  CHECK(test::raw_bytes(dev) == test::raw_bytes(packed));
  CHECK(dev.to(Device::cpu()).to(DType::i64).to_vector<int64_t>() == vals.to_vector<int64_t>());
  // host values straight into a CUDA int4 tensor (converted on the host)
  Tensor dst = empty({7}, {DType::i4x2, test::kCuda});
  copy_(dst, vals);
  CHECK(test::raw_bytes(dst) == test::raw_bytes(packed));
  // int4 has no CUDA kernels: conversions run on the host, and need dense destinations
  CHECK(dev.to(DType::f32).to_vector<float>() == vals.to(DType::f32).to_vector<float>());
  Tensor grid = empty({2, 4}, {DType::i4x2, test::kCuda});
  CHECK_THROWS_WITH(copy_(grid.transpose(0, 1), zeros({4, 2}, {DType::i64})),
                    HasSubstr("packed int4 CUDA destinations must be contiguous"));
}

// Needs two devices: CTest runs it alone as test_gpu_copy_multi_gpu, which skips with fewer (tests/CMakeLists.txt).
TEST_CASE("copies between two GPUs", "[gpu][copy][multi_gpu]") {
  REQUIRE(cuda_device_count() >= 2);
  const Tensor x = test::random_input({257, 3}, 8, DType::f32);
  const Tensor on0 = x.to(Device::cuda(0));
  const Tensor on1 = on0.to(Device::cuda(1));
  CHECK(on1.device() == Device::cuda(1));
  CHECK(on1.to(Device::cpu()).to_vector<float>() == x.to_vector<float>());
  const Tensor t1 = on0.transpose(0, 1).to(Device::cuda(1));  // strided source on the other GPU
  CHECK(t1.to(Device::cpu()).to_vector<float>() == x.transpose(0, 1).to_vector<float>());
  CHECK(add(on1, 1.0).to(Device::cpu()).to_vector<float>() == add(x, 1.0).to_vector<float>());
}

// The shared-memory tiled transpose (copy.cu): same-dtype copies whose source is contiguous along one dim
// and whose destination is contiguous along another, for every element size, batched (3-D index space),
// partial edge tiles, and a destination whose rows are longer than the copied block (copy_ into a narrow).
TEST_CASE("tiled transposes match the CPU bit for bit", "[gpu][copy][transpose]") {
  uint64_t seed = 500;
  for (DType dt : {DType::f32, DType::bf16, DType::u8, DType::i64, DType::f64}) {
    INFO(dtype_name(dt));
    const Tensor x = test::random_input({5, 300, 257}, ++seed, dt, -100, 100);
    const Tensor xc = x.to(test::kCuda);
    Tensor batched, plain;
    {
      test::PoisonGuard poison;
      batched = xc.transpose(1, 2).contiguous();                         // (5, 257, 300)
      plain = xc.reshape({1500, 257}).transpose(0, 1).contiguous();      // (257, 1500)
    }
    CHECK(test::compare_bits(batched, x.transpose(1, 2).contiguous()) == "");
    CHECK(test::compare_bits(plain, x.reshape({1500, 257}).transpose(0, 1).contiguous()) == "");
    const Tensor m = test::random_input({70, 65}, ++seed, dt, -100, 100);
    const Tensor base = test::random_input({65, 100}, ++seed, dt, -5, 5);
    const Tensor cbase = base.to(test::kCuda);
    {
      NoGradGuard ng;
      copy_(base.narrow(1, 3, 70), m.transpose(0, 1));
      copy_(cbase.narrow(1, 3, 70), m.to(test::kCuda).transpose(0, 1));
    }
    CHECK(test::compare_bits(cbase, base) == "");
  }
}

TEST_CASE("copies keeping the last dim contiguous move whole vectors, or fall back when they cannot", "[gpu][copy]") {
  // copy_vector_runs (cuda/kernels/copy.cu): 16-, 8- and 4-byte vectors by the inner size and the offsets; an inner size
  // or an offset that is not a whole vector takes the element-wise kernel. Poisoned allocations: every output
  // element must be written.
  uint64_t seed = 700;
  for (DType dt : {DType::bf16, DType::f32, DType::i8, DType::f64})
    for (int64_t inner : {48, 12, 6, 7}) {
      CAPTURE(dtype_name(dt), inner);
      const Tensor x = test::random_input({3, 5, 6, inner}, ++seed, dt, -100, 100);
      const Tensor xc = x.to(test::kCuda);
      Tensor perm, narrowed, catted;
      {
        test::PoisonGuard poison;
        perm = xc.permute({2, 0, 1, 3}).contiguous();                                   // LBP-WHT's patch order
        narrowed = xc.narrow(3, 1, inner - 1).contiguous();                             // misaligned start
        catted = cat({xc, zeros({3, 5, 2, inner}, {dt, test::kCuda})}, 2);              // a pad into a view
      }
      CHECK(test::compare_bits(perm, x.permute({2, 0, 1, 3}).contiguous()) == "");
      CHECK(test::compare_bits(narrowed, x.narrow(3, 1, inner - 1).contiguous()) == "");
      CHECK(test::compare_bits(catted, cat({x, zeros({3, 5, 2, inner}, {dt})}, 2)) == "");
      // broadcast over an outer dim (stride 0) into a strided destination
      const Tensor row = test::random_input({1, 1, 6, inner}, ++seed, dt, -100, 100);
      const Tensor base = test::random_input({3, 5, 9, inner}, ++seed, dt, -5, 5);
      const Tensor cbase = base.to(test::kCuda);
      {
        NoGradGuard ng;
        copy_(base.narrow(2, 2, 6), row.expand({3, 5, 6, inner}));
        copy_(cbase.narrow(2, 2, 6), row.to(test::kCuda).expand({3, 5, 6, inner}));
      }
      CHECK(test::compare_bits(cbase, base) == "");
    }
}
