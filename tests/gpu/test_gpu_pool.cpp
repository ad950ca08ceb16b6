// The 2-D pools on CUDA against the CPU reference, bit for bit: max_pool2d (random values, values from a
// small set so that windows tie, NaNs), avg_pool2d, adaptive_avg_pool2d (global 1x1 and not), forward with and
// without autograd and backward, in f32, f64, bf16 and f16, for NCHW-contiguous, channels-last (an (N, H, W, C)
// buffer viewed as (N, C, H, W)), other strided and offset (narrowed) inputs, with grad_out either in the
// output's layout or contiguous. Every CUDA allocation is poisoned, so an element a kernel leaves unwritten
// fails; the layout contract (channels-last in, channels-last out and gradient; NCHW otherwise) is asserted.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cmath>
#include <functional>
#include <limits>

#include "hadatrain/autograd/engine.h"
#include "hadatrain/autograd/grad_mode.h"

using namespace ht;

namespace {

enum class Layout { nchw, channels_last, strided, offset };
enum class Values { random, ties, nan };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::nchw: return "nchw";
    case Layout::channels_last: return "channels_last";
    case Layout::strided: return "strided (N, H, C, W)";
    case Layout::offset: return "narrowed (offset)";
  }
  return "?";
}

// Logical (N, C, H, W) f64 values on the CPU: uniform in [-2, 2), or integers 0..3 (ties in every window),
// or those integers with about one element in 7 a NaN (some windows all NaN-free, some with several NaNs).
Tensor make_values(const Shape& s, Values v, uint64_t seed) {
  if (v == Values::random) return test::random_input(s, seed, DType::f64);
  Tensor t = test::random_input(s, seed, DType::i32, 0, 3).to(DType::f64);
  if (v == Values::ties) return t;
  std::vector<double> d = t.to_vector<double>();
  for (std::size_t i = 0; i < d.size(); ++i)
    if ((i * 5 + seed) % 7 == 0) d[i] = std::numeric_limits<double>::quiet_NaN();
  return from_vector(d, s, {DType::f64});
}

// The values in dtype dt on `dev`, laid out as `l`, viewed as (N, C, H, W).
Tensor place(const Tensor& v, Layout l, DType dt, Device dev) {
  auto on = [&](const Tensor& t) { return t.contiguous().to(dt).to(dev); };
  switch (l) {
    case Layout::nchw: return on(v);
    case Layout::channels_last: return on(v.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
    case Layout::strided: return on(v.permute({0, 2, 1, 3})).permute({0, 2, 1, 3});
    case Layout::offset: return on(cat({v.narrow(0, 0, 1), v}, 0)).narrow(0, 1, v.size(0));
  }
  return {};
}

// t is an (N, H, W, C)-contiguous buffer viewed as (N, C, H, W).
bool channels_last_dense(const Tensor& t) { return t.permute({0, 2, 3, 1}).is_contiguous(); }

// Whether the plane and the channels both have more than one element (else the two layouts coincide).
bool layouts_differ(const Tensor& t) { return t.size(1) > 1 && t.size(2) * t.size(3) > 1; }

using Pool = std::function<Tensor(const Tensor&)>;

// Runs `pool` on the CPU and on CUDA: forward without autograd, forward with it and the input gradient for a
// random grad_out (in the output's layout, or contiguous); every result bit-identical to the CPU's.
std::string check_pool(const Pool& pool, const Tensor& values, Layout l, DType dt, uint64_t seed) {
  Tensor leaf_c = place(values, l, dt, Device::cpu()).detach();  // the CPU reference's input
  leaf_c.set_requires_grad(true);
  for (const bool grad_like_y : {true, false}) {
    const Tensor yc = pool(leaf_c);
    const Tensor gv = test::random_input(yc.shape(), seed, DType::f64, 0.5, 1.5);
    const Layout gl = grad_like_y && channels_last_dense(yc) ? Layout::channels_last : Layout::nchw;
    const Tensor gxc = grad({yc}, {leaf_c}, {place(gv, gl, dt, Device::cpu())})[0];
    test::PoisonGuard poison;
    Tensor leaf = place(values, l, dt, test::kCuda).detach();
    leaf.set_requires_grad(true);
    Tensor y0;
    {
      NoGradGuard no_grad;
      y0 = pool(leaf);
    }
    std::string msg = test::compare_bits(y0, yc);
    if (!msg.empty()) return "forward without autograd: " + msg;
    const Tensor y = pool(leaf);
    msg = test::compare_bits(y, yc);
    if (!msg.empty()) return "forward: " + msg;
    const Tensor gx = grad({y}, {leaf}, {place(gv, gl, dt, test::kCuda)})[0];
    msg = test::compare_bits(gx, gxc);
    if (!msg.empty()) return fmt::format("backward (grad_out {}): {}", layout_name(gl), msg);
    // Note [Pool layouts]: a channels-last input gets a channels-last output and gradient, others NCHW.
    const bool cl = l == Layout::channels_last && layouts_differ(leaf);
    for (const Tensor* t : std::vector<const Tensor*>{&y0, &y, &gx}) {
      const bool ok = cl ? (channels_last_dense(*t) && (!layouts_differ(*t) || !t->is_contiguous()))
                         : t->is_contiguous();
      if (!ok) return fmt::format("layout: {} for a {} input", t->describe(), layout_name(l));
    }
    if (!gx.is_cuda() || gx.dtype() != dt) return "gradient: " + gx.describe();
  }
  return {};
}

Pool2dParams params(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return Pool2dParams{kh, kw, sh, sw, ph, pw};
}

const std::vector<Layout> kLayouts = {Layout::nchw, Layout::channels_last, Layout::strided, Layout::offset};

struct FixedCase {
  const char* name;
  Shape x;  // (N, C, H, W)
  Pool2dParams p;
};

const std::vector<FixedCase> kMaxCases = {
    {"ResNet stem 3x3 s2 p1, scaled down", {2, 16, 15, 17}, params(3, 3, 2, 2, 1, 1)},
    {"3x3 s2 p1, odd channels", {2, 5, 9, 11}, params(3, 3, 2, 2, 1, 1)},
    {"2x2 s2 on odd sizes", {3, 8, 7, 9}, params(2, 2, 2, 2, 0, 0)},
    {"3x3 s1 p1", {2, 8, 6, 7}, params(3, 3, 1, 1, 1, 1)},
    {"1x1 s1", {2, 3, 5, 6}, params(1, 1, 1, 1, 0, 0)},
    {"5x5 s3 p2, 24 channels", {1, 24, 13, 8}, params(5, 5, 3, 3, 2, 2)},
    {"3x2 s(1, 2) p(1, 0), overlapping", {1, 16, 6, 7}, params(3, 2, 1, 2, 1, 0)},
};

}  // namespace

TEST_CASE("max_pool2d on CUDA is bit-identical to the CPU: layouts, ties, NaN, forward and backward", "[gpu][pool]") {
  uint64_t seed = 5000;
  for (const FixedCase& fc : kMaxCases)
    for (DType dt : test::kFloatDTypes)
      for (Layout l : kLayouts)
        for (Values v : {Values::random, Values::ties, Values::nan}) {
          const Pool2dParams p = fc.p;
          INFO(fc.name << " " << to_string(fc.x) << " " << dtype_name(dt) << " " << layout_name(l) << " values "
                       << static_cast<int>(v));
          const Tensor values = make_values(fc.x, v, seed += 3);
          CHECK(check_pool([p](const Tensor& x) { return max_pool2d(x, p); }, values, l, dt, seed + 1) == "");
        }
}

TEST_CASE("avg_pool2d on CUDA is bit-identical to the CPU in every layout", "[gpu][pool]") {
  const std::vector<FixedCase> cases = {
      {"3x3 s2 p1", {2, 16, 15, 17}, params(3, 3, 2, 2, 1, 1)},
      {"2x2 s2 on odd sizes", {3, 8, 7, 9}, params(2, 2, 2, 2, 0, 0)},
      {"3x2 s(1, 2) p(1, 0), odd channels", {1, 5, 6, 7}, params(3, 2, 1, 2, 1, 0)},
      {"4x4 s4 on 4x4: one window, the global path", {2, 8, 4, 4}, params(4, 4, 4, 4, 0, 0)},
      {"3x3 s3 p1 on 3x3: one window, padded (not global)", {2, 8, 3, 3}, params(3, 3, 3, 3, 1, 1)},
      {"3x3 s3 p1 on 2x2: one padded window covering the plane (global path, divisor 9)", {2, 8, 2, 2},
       params(3, 3, 3, 3, 1, 1)},
  };
  uint64_t seed = 6000;
  for (const FixedCase& fc : cases)
    for (DType dt : test::kFloatDTypes)
      for (Layout l : kLayouts) {
        const Pool2dParams p = fc.p;
        INFO(fc.name << " " << to_string(fc.x) << " " << dtype_name(dt) << " " << layout_name(l));
        const Tensor values = make_values(fc.x, Values::random, seed += 3);
        CHECK(check_pool([p](const Tensor& x) { return avg_pool2d(x, p); }, values, l, dt, seed + 1) == "");
      }
}

TEST_CASE("adaptive_avg_pool2d on CUDA is bit-identical to the CPU: global (1x1) and other bins", "[gpu][pool]") {
  struct Case {
    Shape x;
    int64_t oh, ow;
  };
  const std::vector<Case> cases = {
      {{2, 16, 7, 7}, 1, 1},   // ResNet head shapes, scaled down
      {{3, 24, 4, 4}, 1, 1},
      {{2, 8, 1, 1}, 1, 1},
      {{2, 9, 13, 5}, 1, 1},   // odd plane and channels
      {{3, 50, 7, 7}, 1, 1},   // 150 planes: several shared-memory blocks, the last one partial
      {{1, 4, 70, 60}, 1, 1},  // a plane too large for the shared-memory kernel
      // channels-last global kernels: 264 channels are two channel chunks of 256, the second partial; 121
      // pixels are two staged pixel chunks in bf16 / f16 (96 a chunk), 6 in f64 (24), with 16-byte loads
      {{2, 264, 3, 3}, 1, 1},
      {{2, 16, 11, 11}, 1, 1},
      {{2, 16, 7, 7}, 3, 2},
      {{2, 5, 9, 11}, 4, 5},
      {{1, 8, 5, 4}, 9, 11},   // more bins than rows: overlapping one-row bins
  };
  uint64_t seed = 7000;
  for (const Case& c : cases)
    for (DType dt : test::kFloatDTypes)
      for (Layout l : kLayouts) {
        const int64_t oh = c.oh, ow = c.ow;
        INFO(to_string(c.x) << " -> (" << oh << ", " << ow << ") " << dtype_name(dt) << " " << layout_name(l));
        const Tensor values = make_values(c.x, Values::random, seed += 3);
        CHECK(check_pool([oh, ow](const Tensor& x) { return adaptive_avg_pool2d(x, oh, ow); }, values, l, dt,
                         seed + 1) == "");
      }
}

TEST_CASE("global average pool backward on CUDA keeps the CPU's +0 for a -0 gradient", "[gpu][pool]") {
  // The CPU's gradient is 0 + g / (H * W): a -0 share becomes +0. Half the gradients are -0 here.
  for (Layout l : {Layout::nchw, Layout::channels_last})
    for (DType dt : test::kFloatDTypes) {
      INFO(layout_name(l) << " " << dtype_name(dt));
      const Shape s{2, 16, 7, 7};
      Tensor xc = place(test::random_input(s, 91, DType::f64), l, dt, Device::cpu()).detach();
      xc.set_requires_grad(true);
      const Tensor yc = adaptive_avg_pool2d(xc, 1, 1);
      std::vector<double> g(32);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = i % 2 ? -0.0 : 0.25 * static_cast<double>(i);
      const Tensor gy = from_vector(g, {2, 16, 1, 1}, {DType::f64}).to(dt);
      const Tensor gxc = grad({yc}, {xc}, {gy})[0];
      test::PoisonGuard poison;
      Tensor xg = place(test::random_input(s, 91, DType::f64), l, dt, test::kCuda).detach();
      xg.set_requires_grad(true);
      const Tensor gxg = grad({adaptive_avg_pool2d(xg, 1, 1)}, {xg}, {gy.to(test::kCuda)})[0];
      CHECK(test::compare_bits(gxg, gxc) == "");
    }
}

TEST_CASE("pools on CUDA in fp8 (computed in f32) match the CPU, channels-last included", "[gpu][pool]") {
  const Pool2dParams p = params(3, 3, 2, 2, 1, 1);
  uint64_t seed = 8000;
  for (Layout l : {Layout::nchw, Layout::channels_last}) {
    INFO(layout_name(l));
    const Tensor values = make_values({2, 16, 9, 7}, Values::ties, seed += 3);
    CHECK(check_pool([p](const Tensor& x) { return max_pool2d(x, p); }, values, l, DType::f8e4m3, seed + 1) == "");
    CHECK(check_pool([](const Tensor& x) { return adaptive_avg_pool2d(x, 1, 1); }, values, l, DType::f8e4m3,
                     seed + 2) == "");
  }
}
