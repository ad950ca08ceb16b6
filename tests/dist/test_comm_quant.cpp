// The low-precision communication codecs (dist/comm_quant.h) in one process, the ranks simulated:
//   - 8-bit weight all-gather (Note [8-bit weight all-gather]): the shards quantised with the max of their
//     absmaxes give the bytes of HALO's quantiser on the whole weight; the reconstruction error is within the
//     derived int8 / fp8 bounds; HALO's int8 quantiser gives the gathered codes back from the dequantised weight
//     (rows of a rotation size); weights whose rotated values are codes times a power of two round-trip exactly;
//   - block-quantised reduce-scatter (Note [Quantised reduce-scatter]): every element of the dequantised sum is
//     within Σ_r s_r/2 of the exact sum (int8 and int4, chunks that need padding); values that are levels
//     times their block's scale sum exactly; option errors name the key;
//   - the dist config keys (gather_dtype, reduce_quant, reduce_quant_block, timeout_s) and their errors.
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/dist/comm_quant.h"
#include "hadatrain/dist/options.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;

namespace {

// W (O, C) f32 with a few outlier columns (what the rotation spreads out).
Tensor weight(int64_t O, int64_t C, uint64_t seed) {
  Tensor w = test::random_tensor({O, C}, seed, DType::f32, -0.05, 0.05);
  for (int64_t r = 0; r < O; r += 5) w.data<float>()[r * C + (r * 7) % C] = 0.9f * (r % 2 ? -1.0f : 1.0f);
  return w;
}

// The all-gather simulated: N shards of whole rows (the last padded with zero rows), the max of their absmaxes,
// each quantised with it, the codes joined in rank order and dequantised; also returns the joined codes.
struct Gathered {
  Tensor w;      // (N·R, C) f32
  Tensor codes;  // (N·R, n)
  Tensor scale;  // f32 (1), the same on every rank
};
Gathered gather_8bit(const dist::RowCodec& c, const Tensor& w, int64_t ranks) {
  const int64_t O = w.size(0), R = (O + ranks - 1) / ranks;
  Tensor padded = zeros({ranks * R, c.cols}, {DType::f32});
  copy_(padded.narrow(0, 0, O), w);
  Tensor m = zeros({1}, {DType::f32});
  for (int64_t r = 0; r < ranks; ++r) m = maximum(m, dist::rows_absmax(c, padded.narrow(0, r * R, R)));
  std::vector<Tensor> codes;
  Tensor scale;
  for (int64_t r = 0; r < ranks; ++r) {
    const auto q = dist::quantize_rows(c, padded.narrow(0, r * R, R).contiguous(), m);
    codes.push_back(q.codes);
    if (scale.defined()) REQUIRE(q.scale.item() == scale.item());  // every rank derives the same scale
    scale = q.scale;
  }
  Gathered g;
  g.codes = cat(codes, 0);
  g.scale = scale;
  g.w = dist::dequantize_rows(c, {g.codes, g.scale});
  return g;
}

double frob(const Tensor& t) { return std::sqrt(sum(mul(t.to(DType::f64), t.to(DType::f64))).item()); }

}  // namespace

TEST_CASE("8-bit weight all-gather: HALO's codes of the whole weight, within the derived bound", "[comm_quant]") {
  for (const int64_t cols : {64, 96, 100}) {  // 2^6; 12·8; 100 -> 112 = 28·4 (zero-padded columns)
    for (const auto carrier : {dist::GatherDType::int8, dist::GatherDType::fp8}) {
      const dist::RowCodec c = dist::make_row_codec(carrier, cols, "test");
      const Tensor w = weight(37, cols, static_cast<uint64_t>(cols));  // 37 rows: 3 ranks hold 13, 13, 11 + 2 padding
      const Gathered g = gather_8bit(c, w, 3);
      INFO("cols " << cols << " carrier " << dist::gather_dtype_name(carrier) << " rotation " << c.rotation.n);
      // The shards with the shared absmax are the whole weight quantised by HALO (rows beyond O are zero codes).
      const auto whole = grad::halo_quantize(w, c.carrier, c.rotation);
      REQUIRE(whole.scale.item() == g.scale.item());
      const auto* a = static_cast<const uint8_t*>(whole.codes.data_ptr());
      const auto* b = static_cast<const uint8_t*>(g.codes.data_ptr());
      for (int64_t i = 0; i < whole.codes.numel(); ++i) REQUIRE(a[i] == b[i]);
      for (int64_t i = whole.codes.numel(); i < g.codes.numel(); ++i) REQUIRE(b[i] == 0);
      // The bound of Note [8-bit weight all-gather], with 1e-5 relative for the f32 rotations' rounding.
      const Tensor err = sub(g.w.narrow(0, 0, 37), w);
      const double s = g.scale.item(), rows = static_cast<double>(g.w.size(0));
      const double bound = carrier == dist::GatherDType::int8 ? 0.5 * s * std::sqrt(rows)
                                                              : std::ldexp(1.0, -4) * frob(w) + std::ldexp(s, -10) * std::sqrt(rows);
      CHECK(frob(err) <= bound * (1 + 1e-5) + 1e-6 * frob(w));
      // And the error is real quantisation error, not zero: the bound is not vacuous for this weight.
      CHECK(frob(err) > 0.01 * bound);
      // Padding rows come back as zeros.
      CHECK(frob(g.w.narrow(0, 37, g.w.size(0) - 37)) == 0.0);
      // A HALO layer re-quantises the dequantised weight: with rows of a rotation size and int8, that gives back
      // the gathered codes (the rotations' f32 rounding moves a value by far less than half a step).
      if (c.rotation.n == cols && carrier == dist::GatherDType::int8) {
        const auto again = grad::halo_quantize(g.w.narrow(0, 0, 37), c.carrier, c.rotation);
        const auto* r = static_cast<const uint8_t*>(again.codes.data_ptr());
        for (int64_t i = 0; i < again.codes.numel(); ++i) REQUIRE(r[i] == a[i]);
      }
    }
  }
}

TEST_CASE("8-bit weight all-gather: exact when the rotated values are codes", "[comm_quant]") {
  // v (R, 64) small integers with max |v| = 127 (int8) or values of e4m3 with max 448 (fp8): W = v·H̃ᵀ/64 is exact
  // in f32, W·H̃ = v exactly, the scale is 1 and the reconstruction is W bit for bit.
  for (const auto carrier : {dist::GatherDType::int8, dist::GatherDType::fp8}) {
    const int64_t R = 6, n = 64;
    const float top = carrier == dist::GatherDType::int8 ? 127.0f : 448.0f;
    Tensor v = zeros({R, n}, {DType::f32});
    for (int64_t i = 0; i < R * n; ++i) v.data<float>()[i] = static_cast<float>(static_cast<int>((i * 37) % 17) - 8);
    v.data<float>()[5] = top;
    const dist::RowCodec c = dist::make_row_codec(carrier, n, "test");
    const Tensor w = grad::halo_rotate(v, {.rotation = c.rotation, .direction = grad::HaloDirection::inverse,
                                           .cols = n, .mult = 1.0f / 64, .out_dtype = DType::f32});
    const Gathered g = gather_8bit(c, w, 2);
    REQUIRE(g.scale.item() == 1.0);
    REQUIRE(test::compare(g.w, w, 0, 0).empty());
  }
}

TEST_CASE("8-bit row codec: a weight too wide for HALO's rotation names it", "[comm_quant]") {
  const std::string e = test::error_of([] { dist::make_row_codec(dist::GatherDType::int8, 40000, "model.wide.weight"); });
  CHECK(e.find("model.wide.weight") != std::string::npos);
  CHECK(e.find("40000 columns") != std::string::npos);
}

namespace {

// N ranks' inputs quantised and "gathered" (joined in rank order), then each destination's chunk summed.
std::vector<Tensor> simulated_reduce(const std::vector<Tensor>& inputs, const dist::QuantReduceSpec& spec,
                                     std::vector<dist::BlockCodes>* codes_out = nullptr) {
  const int64_t N = static_cast<int64_t>(inputs.size()), c = inputs[0].numel() / N;
  std::vector<Tensor> codes, scales;
  for (const Tensor& x : inputs) {
    const dist::BlockCodes b = dist::quantize_blocks(x, N, spec);
    codes.push_back(b.codes);
    scales.push_back(b.scales);
    if (codes_out) codes_out->push_back(b);
  }
  const dist::BlockCodes all{cat(codes, 0), cat(scales, 0)};
  std::vector<Tensor> out;
  for (int64_t j = 0; j < N; ++j) out.push_back(dist::dequantize_sum(all, N, c, j, spec));
  return out;
}

}  // namespace

TEST_CASE("block-quantised reduce-scatter: each element within half a step per rank", "[comm_quant]") {
  for (const int bits : {8, 4}) {
    for (const int64_t ranks : {2, 3}) {
      const int64_t c = 37, B = 8;  // 37 values per destination: blocks padded to 40
      const dist::QuantReduceSpec spec{.bits = bits, .block = B};
      std::vector<Tensor> inputs;
      for (int64_t r = 0; r < ranks; ++r)
        inputs.push_back(test::random_tensor({ranks * c}, 100 + static_cast<uint64_t>(r), DType::f32, -1.0, 1.0));
      std::vector<dist::BlockCodes> codes;
      const auto out = simulated_reduce(inputs, spec, &codes);
      const double qmax = bits == 8 ? 127.0 : 7.0;
      double err2 = 0, ref2 = 0;
      for (int64_t j = 0; j < ranks; ++j) {
        REQUIRE(out[static_cast<std::size_t>(j)].numel() == c);
        for (int64_t e = 0; e < c; ++e) {
          double exact = 0, bound = 0;
          for (int64_t r = 0; r < ranks; ++r) {
            const auto& x = inputs[static_cast<std::size_t>(r)];
            exact += x.data<float>()[j * c + e];
            // the block's scale is absmax/qmax of its values: recomputed here from the input
            const int64_t blk = e / B;
            double m = 0;
            for (int64_t k = blk * B; k < std::min((blk + 1) * B, c); ++k) m = std::max(m, std::abs(double(x.data<float>()[j * c + k])));
            bound += 0.5 * m / qmax;
            REQUIRE(codes[static_cast<std::size_t>(r)].scales.data<float>()[j * 5 + blk] == static_cast<float>(m) / static_cast<float>(qmax));
          }
          const double got = out[static_cast<std::size_t>(j)].data<float>()[e];
          INFO(bits << " bits, " << ranks << " ranks, chunk " << j << " element " << e);
          REQUIRE(std::abs(got - exact) <= bound * (1 + 1e-5) + 1e-6);
          err2 += (got - exact) * (got - exact);
          ref2 += exact * exact;
        }
      }
      // Relative L2 error: about a step / √12 over the value spread; far from 0 and from 1.
      const double rel = std::sqrt(err2 / ref2);
      CHECK(rel > (bits == 8 ? 1e-4 : 1e-2));
      CHECK(rel < (bits == 8 ? 1e-2 : 0.2));
    }
  }
}

TEST_CASE("block-quantised reduce-scatter: exact for levels times their scale", "[comm_quant]") {
  for (const int bits : {8, 4}) {
    const int64_t N = 2, c = 16, B = 4;
    const int qmax = bits == 8 ? 127 : 7;
    std::vector<Tensor> inputs;
    for (int64_t r = 0; r < N; ++r) {
      Tensor x = zeros({N * c}, {DType::f32});
      for (int64_t i = 0; i < N * c; ++i) {
        const int level = i % B == 0 ? qmax : static_cast<int>((i * 5 + r * 3) % (2 * qmax + 1)) - qmax;
        x.data<float>()[i] = static_cast<float>(level) * 0.25f * static_cast<float>(r + 1);  // scale 0.25·(r+1)
      }
      inputs.push_back(x);
    }
    const auto out = simulated_reduce(inputs, {.bits = bits, .block = B});
    for (int64_t j = 0; j < N; ++j) {
      const Tensor exact = add(inputs[0].narrow(0, j * c, c), inputs[1].narrow(0, j * c, c));
      REQUIRE(test::compare(out[static_cast<std::size_t>(j)], exact, 0, 0).empty());
    }
  }
}

TEST_CASE("block-quantised reduce-scatter: options and sizes are checked", "[comm_quant]") {
  const Tensor x = zeros({12}, {DType::f32});
  CHECK(test::error_of([&] { dist::quantize_blocks(x, 2, {.bits = 4, .block = 3}); }).find("dist.reduce_quant_block") !=
        std::string::npos);
  CHECK(test::error_of([&] { dist::quantize_blocks(x, 2, {.bits = 2, .block = 4}); }).find("dist.reduce_quant") !=
        std::string::npos);
  CHECK(test::error_of([&] { dist::quantize_blocks(x, 5, {.bits = 8, .block = 4}); }).find("N = 5 ranks") !=
        std::string::npos);
  // An all-zero input: zero codes and scales, an exact zero sum.
  const auto out = simulated_reduce({x, x}, {.bits = 8, .block = 4});
  CHECK(test::compare(out[1], zeros({6}, {DType::f32}), 0, 0).empty());
}

TEST_CASE("dist config: the low-precision communication keys", "[comm_quant][config]") {
  const auto read = [](const std::string& yaml) {
    ConfigReader root = ConfigReader::from_string(yaml, "c.yaml");
    const dist::DistOptions o = dist::read_dist_options(root.child("dist"));
    root.finish();  // a key of another mode is reported here
    return o;
  };
  const dist::DistOptions o = read("dist:\n  mode: fsdp\n  gather_dtype: fp8\n  reduce_quant: int4\n  reduce_quant_block: 64\n");
  CHECK(o.gather_dtype == dist::GatherDType::fp8);
  CHECK(o.reduce_quant == dist::ReduceQuant::int4);
  CHECK(o.reduce_quant_block == 64);
  CHECK(o.reduce_quant_error_every == 100);
  const dist::DistOptions d = read("dist:\n  mode: fsdp\n");
  CHECK(d.gather_dtype == dist::GatherDType::f32);
  CHECK(d.reduce_quant == dist::ReduceQuant::none);
  CHECK(test::error_of([&] { read("dist:\n  mode: fsdp\n  gather_dtype: int4\n"); }).find("gather_dtype") != std::string::npos);
  CHECK(test::error_of([&] { read("dist:\n  mode: ddp\n  gather_dtype: int8\n"); }).find("for dist.mode fsdp") !=
        std::string::npos);
  // The collectives' timeout is whole milliseconds: a value that would round to 0 ms or overflow is refused.
  CHECK(read("dist:\n  mode: ddp\n  timeout_s: 0.001\n").timeout_s == 0.001);
  for (const char* bad : {"0.0001", "1e300", "604801"})
    CHECK(test::error_of([&] { read(fmt::format("dist:\n  mode: ddp\n  timeout_s: {}\n", bad)); }).find("dist.timeout_s") !=
          std::string::npos);
}
