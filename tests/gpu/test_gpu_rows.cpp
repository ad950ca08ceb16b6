// CUDA row ops against the CPU reference: softmax / log_softmax (any dim), cross_entropy (label smoothing,
// ignore_index, every reduction, device-side target check), layer_norm, rms_norm, embedding (repeated ids,
// device-side id check) and max / argmax (ties, NaN), forward and backward, for f32, bf16 and f64, with row
// lengths 1, 7, 1000 and 4097, non-contiguous inputs and poisoned CUDA allocations.
//
// Tolerances: the shared table, widened where the GPU reduces a row in float while the CPU reference works
// in double (f32: 10x the table, a float sum over 4097 elements carries about 1e-6 relative error), and for
// narrow dtypes 2x, because a backward reads the forward output, which may already differ by one ulp.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cmath>
#include <functional>

#include "kernels/rows.h"  // set_norm_kernel_variant

using namespace ht;

namespace {

using Graph = std::function<Tensor(const std::vector<Tensor>&)>;

const std::vector<DType> kDTypes = {DType::f32, DType::bf16, DType::f64};
const std::vector<int64_t> kLens = {1, 7, 1000, 4097};

test::Tolerance row_tol(DType dt) {
  test::Tolerance t = test::tolerance(dt);
  const double k = dt == DType::f32 ? 10.0 : (dt == DType::bf16 || dt == DType::f16 ? 2.0 : 1.0);
  return {t.rtol * k, t.atol * k};
}

// Leaves with the same values on `dev`; floating ones require grad.
std::vector<Tensor> leaves(const std::vector<Tensor>& values, Device dev) {
  std::vector<Tensor> out;
  for (const Tensor& v : values) {
    if (!v.defined()) {
      out.push_back(Tensor());
      continue;
    }
    Tensor t = v.to(dev).detach();
    if (is_floating(t.dtype())) t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

// Runs f on both devices, then backward of sum(f(..) * r) with a random r (so that the gradient of a
// softmax is not identically zero); "" when the outputs and every gradient agree.
std::string check_op(const Graph& f, const std::vector<Tensor>& values, test::Tolerance fwd_tol,
                     test::Tolerance grad_tol, uint64_t seed = 99) {
  auto cpu = leaves(values, Device::cpu());
  Tensor yc = f(cpu);
  const Tensor r = test::random_input(yc.shape(), seed, yc.dtype(), 0.5, 1.5);
  Tensor yg;
  std::vector<Tensor> gpu;
  {
    test::PoisonGuard poison;
    gpu = leaves(values, test::kCuda);
    yg = f(gpu);
    if (yg.requires_grad()) sum(mul(yg, r.to(test::kCuda))).backward();
  }
  std::string msg = test::compare_to_cpu(yg, yc, fwd_tol);
  if (!msg.empty()) return "forward: " + msg;
  if (!yc.requires_grad()) return {};
  sum(mul(yc, r)).backward();
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (!cpu[i].defined() || !cpu[i].requires_grad()) continue;
    if (!cpu[i].grad().defined()) {
      if (gpu[i].grad().defined()) return fmt::format("input {}: a gradient on CUDA but none on the CPU", i);
      continue;
    }
    if (!gpu[i].grad().defined()) return fmt::format("input {}: no gradient on CUDA", i);
    msg = test::compare_to_cpu(gpu[i].grad(), cpu[i].grad(), grad_tol);
    if (!msg.empty()) return fmt::format("gradient of input {}: {}", i, msg);
  }
  return {};
}

std::string check_op(const Graph& f, const std::vector<Tensor>& values, DType dt) {
  return check_op(f, values, row_tol(dt), row_tol(dt));
}

// Runs body once per layer_norm / rms_norm kernel variant (kernels::set_norm_kernel_variant: 1 the
// register-resident kernels, 2 the staged ones with the parameters in shared memory, 3 the staged ones with
// the parameters in registers, 4 the staged backward adding its parameter-gradient partial sums in thread block
// clusters), whatever HADATRAIN_NORM_KERNEL says; the environment's choice is restored after.
struct NormVariant {
  explicit NormVariant(int v) { kernels::set_norm_kernel_variant(v); }
  ~NormVariant() { kernels::set_norm_kernel_variant(0); }
  NormVariant(const NormVariant&) = delete;
  NormVariant& operator=(const NormVariant&) = delete;
};
template <class F>
void each_norm_variant(F&& body) {
  for (int v = 1; v <= kernels::kNormKernelVariants; ++v) {
    NormVariant guard(v);
    INFO("norm kernel variant " << v);
    body();
  }
}

Tensor ids_tensor(const std::vector<int64_t>& v, const Shape& shape, DType dt) {
  return from_vector(v, shape).to(dt);
}

}  // namespace

TEST_CASE("softmax and log_softmax on CUDA match the CPU, forward and backward", "[gpu][rows][softmax]") {
  uint64_t seed = 1;
  for (DType dt : kDTypes) {
    for (int64_t len : kLens) {
      const Tensor x = test::random_input({5, len}, ++seed, dt, -4.0, 4.0);
      INFO(dtype_name(dt) << " len " << len);
      CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], -1); }, {x}, dt) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {x}, dt) == "");
      // a non-contiguous input: the rows of the transposed view are strided
      const Tensor xt = test::random_input({len, 3}, ++seed, dt, -4.0, 4.0);
      CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0].transpose(0, 1), -1); }, {xt}, dt) == "");
    }
    // over a non-last dim (middle and first), of a 3-D tensor
    const Tensor x3 = test::random_input({4, 1000, 3}, ++seed, dt, -4.0, 4.0);
    INFO(dtype_name(dt) << " non-last dims");
    CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {x3}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return log_softmax(in[0], 0); }, {x3}, dt) == "");
    // a non-contiguous incoming gradient (through a transpose after the softmax)
    CHECK(check_op([](const std::vector<Tensor>& in) { return log_softmax(in[0], 2).transpose(0, 1); }, {x3}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], 1).transpose(1, 2); }, {x3}, dt) == "");
  }
  // many short rows: more row groups than blocks in the grid (the grid-stride loop) and a 0-d input
  const Tensor many = test::random_input({70001, 3}, 7, DType::f32, -4.0, 4.0);
  CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {many}, DType::f32) == "");
  const Tensor scalar = test::random_input({}, 8, DType::f32);
  CHECK(test::compare_to_cpu(log_softmax(scalar.to(test::kCuda), 0), log_softmax(scalar, 0)) == "");
  CHECK(test::compare_to_cpu(softmax(scalar.to(test::kCuda), -1), softmax(scalar, -1)) == "");
}

TEST_CASE("softmax on CUDA: -inf entries and NaN rows as on the CPU", "[gpu][rows][softmax]") {
  const double inf = INFINITY, nan = NAN;
  const Tensor x = from_vector(std::vector<double>{1, -inf, 2, 0, nan, 1, -inf, -inf, -inf}, {3, 3});
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor xd = x.to(dt);
    CHECK(test::compare_to_cpu(softmax(xd.to(test::kCuda), 1), softmax(xd, 1), row_tol(dt)) == "");
    CHECK(test::compare_to_cpu(log_softmax(xd.to(test::kCuda), 1), log_softmax(xd, 1), row_tol(dt)) == "");
  }
}

// The register-cached forward kernels (packable rows): -inf and NaN entries in rows whose lanes see only
// -inf, rows of -inf, and many rows (more row groups than blocks, a partial last group) of several widths.
TEST_CASE("softmax and layer_norm on CUDA: cached row kernels, -inf / NaN in packable rows, many rows",
          "[gpu][rows][softmax]") {
  const double inf = INFINITY, nan = NAN;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    const int64_t len = 1024;
    std::vector<double> v(4 * len, -inf);
    v[5] = 2.0;                                        // row 0: one finite value, every other lane only -inf
    for (int64_t j = 0; j < len; ++j) v[len + j] = 0.001 * static_cast<double>(j % 97);  // row 1: finite
    v[len + 700] = -inf;
    v[2 * len + 3] = 1.0;                              // row 2: a NaN in another lane than the finite values
    v[2 * len + 900] = nan;
    // row 3: all -inf
    const Tensor x = from_vector(v, {4, len}).to(dt);
    INFO(dtype_name(dt));
    CHECK(test::compare_to_cpu(softmax(x.to(test::kCuda), 1), softmax(x, 1), row_tol(dt)) == "");
    CHECK(test::compare_to_cpu(log_softmax(x.to(test::kCuda), 1), log_softmax(x, 1), row_tol(dt)) == "");
  }
  uint64_t seed = 5200;
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (const Shape& shape : {Shape{20003, 64}, Shape{4001, 520}, Shape{3001, 1024}, Shape{2001, 4096}, Shape{301, 8192}}) {
      const Tensor x = test::random_input(shape, ++seed, dt, -4.0, 4.0);
      const Tensor w = test::random_input({shape[1]}, ++seed, DType::f32, 0.5, 1.5);
      const Tensor b = test::random_input({shape[1]}, ++seed, DType::f32, -1.0, 1.0);
      const Tensor xc = x.to(test::kCuda), wc = w.to(test::kCuda), bc = b.to(test::kCuda);
      INFO(dtype_name(dt) << " " << to_string(shape));
      test::PoisonGuard poison;
      CHECK(test::compare_to_cpu(softmax(xc, 1), softmax(x, 1), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(log_softmax(xc, 1), log_softmax(x, 1), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(layer_norm(xc, wc, bc), layer_norm(x, w, b), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(rms_norm(xc, Tensor()), rms_norm(x, Tensor()), row_tol(dt)) == "");
    }
  }
}

// The bf16 / f16 paths of the register-cached forward kernels (rows.cu, rows_norm_cached.cu): a softmax row maximum of large
// magnitude (e^(x - m) as 2^(x log2e - m log2e) below |m| = 2^23, (x - m) log2e above), and NaN / inf
// parameters of layer_norm, whose NaN results the pack-wise rounding must detect and patch like store_cast.
TEST_CASE("softmax and layer_norm on CUDA: cached row kernels with large logits and non-finite parameters",
          "[gpu][rows][softmax]") {
  uint64_t seed = 5300;
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::vector<double> scales =
        dt == DType::f16 ? std::vector<double>{1e3, 6e4} : std::vector<double>{1e3, 6e6, 8.5e6, 1e9, 1e30};
    for (double scale : scales) {
      const Tensor x = test::random_input({7, 1024}, ++seed, dt, -scale, scale);
      INFO(dtype_name(dt) << " scale " << scale);
      CHECK(test::compare_to_cpu(softmax(x.to(test::kCuda), 1), softmax(x, 1), row_tol(dt)) == "");
      CHECK(test::compare_to_cpu(log_softmax(x.to(test::kCuda), 1), log_softmax(x, 1), row_tol(dt)) == "");
    }
    // ties at the maximum just below 2^23 (bf16; f16 saturates at 65504, its -1e6 is -inf): e of the max
    // scaled by the rounding of m log2e, which cancels in e / s
    std::vector<double> v(3 * 512, -1e6);
    v[10] = v[300] = dt == DType::f16 ? 6e4 : 8.3e6;
    v[512 + 7] = 4096.0;
    v[1024 + 100] = -5e6;
    const Tensor t = from_vector(v, {3, 512}).to(dt);
    INFO(dtype_name(dt) << " ties");
    CHECK(test::compare_to_cpu(softmax(t.to(test::kCuda), 1), softmax(t, 1), row_tol(dt)) == "");
  }
  const double inf = INFINITY, nan = NAN;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (DType pdt : {dt, DType::f32}) {  // parameters in the row dtype (read as they are) or f32
      Tensor x = test::random_input({5, 1024}, ++seed, dt, -2.0, 2.0);
      std::vector<double> xv = x.to_vector<double>();
      xv[3 * 1024 + 17] = nan;  // row 3: NaN everywhere
      x = from_vector(xv, {5, 1024}).to(dt);
      std::vector<double> wv = test::random_input({1024}, ++seed, DType::f64, 0.5, 1.5).to_vector<double>();
      std::vector<double> bv = test::random_input({1024}, ++seed, DType::f64, -1.0, 1.0).to_vector<double>();
      wv[3] = nan;    // column 3: NaN
      bv[700] = inf;  // column 700: +inf
      wv[701] = inf;  // column 701: +-inf (or NaN where x - mean is 0)
      const Tensor w = from_vector(wv, {1024}).to(pdt), b = from_vector(bv, {1024}).to(pdt);
      INFO(dtype_name(dt) << " x, " << dtype_name(pdt) << " parameters");
      CHECK(test::compare_to_cpu(layer_norm(x.to(test::kCuda), w.to(test::kCuda), b.to(test::kCuda)), layer_norm(x, w, b),
                                 row_tol(dt)) == "");
    }
  }
}

TEST_CASE("cross_entropy on CUDA matches the CPU for every reduction, label smoothing and ignore_index",
          "[gpu][rows][cross_entropy]") {
  uint64_t seed = 100;
  const int64_t n = 37;
  for (DType dt : kDTypes) {
    for (int64_t c : kLens) {
      const Tensor logits = test::random_input({n, c}, ++seed, dt, -3.0, 3.0);
      std::vector<int64_t> t = test::random_input({n}, ++seed, DType::i64, 0, static_cast<double>(c - 1)).to_vector<int64_t>();
      t[3] = -100;  // the default ignore_index
      t[10] = -100;
      for (DType tdt : {DType::i64, DType::i32}) {
        const Tensor target = ids_tensor(t, {n}, tdt);
        for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum}) {
          for (double ls : {0.0, 0.1}) {
            INFO(dtype_name(dt) << " C " << c << " target " << dtype_name(tdt) << " reduction "
                                << static_cast<int>(red) << " smoothing " << ls);
            const CrossEntropyOptions opts{-100, ls, red};
            CHECK(check_op([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], opts); },
                           {logits, target}, dt) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("cross_entropy on CUDA: custom ignore_index, all rows ignored, strided logits", "[gpu][rows][cross_entropy]") {
  const Tensor logits = test::random_input({9, 7}, 200, DType::f32, -3.0, 3.0);
  const Tensor target = ids_tensor({0, 3, 6, 3, 2, 3, 1, 5, 4}, {9}, DType::i64);
  const CrossEntropyOptions custom{3, 0.2, Reduction::mean};
  CHECK(check_op([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], custom); }, {logits, target},
                 DType::f32) == "");
  // every row ignored: mean is NaN on both devices, and the gradient is zero
  const Tensor all_ignored = ids_tensor(std::vector<int64_t>(9, -100), {9}, DType::i64);
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
    const CrossEntropyOptions opts{-100, 0.0, red};
    CHECK(check_op([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], opts); },
                   {logits, all_ignored}, DType::f32) == "");
  }
  // non-contiguous logits: the transpose of a (C, N) tensor
  const Tensor lt = test::random_input({7, 9}, 201, DType::f64, -3.0, 3.0);
  CHECK(check_op([&](const std::vector<Tensor>& in) { return cross_entropy(in[0].transpose(0, 1), in[1]); },
                 {lt, target}, DType::f64) == "");
}

TEST_CASE("cross_entropy on CUDA rejects out-of-range targets (checked on the device)", "[gpu][rows][cross_entropy]") {
  const Tensor logits = test::random_input({4, 5}, 300, DType::f32).to(test::kCuda);
  for (int64_t bad : {5, -1, 1000}) {
    const Tensor target = ids_tensor({0, 1, bad, 7}, {4}, DType::i64).to(test::kCuda);
    CHECK_THROWS_WITH(cross_entropy(logits, target),
                      HasSubstr("target[2] = " + std::to_string(bad) + " is out of range for 5 classes"));
  }
  // the same tensors without the bad value work (the status buffer is per call)
  CHECK(std::isfinite(cross_entropy(logits, ids_tensor({0, 1, 2, 4}, {4}, DType::i32).to(test::kCuda)).item()));
}

TEST_CASE("layer_norm and rms_norm on CUDA match the CPU, with and without affine parameters",
          "[gpu][rows][norm]") {
  each_norm_variant([&] {
    uint64_t seed = 400;
    for (DType dt : kDTypes) {
      for (int64_t d : kLens) {
        const Tensor x = test::random_input({2, 3, d}, ++seed, dt, -2.0, 3.0);
        const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
        const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
        INFO(dtype_name(dt) << " D " << d);
        // D = 1: x - mean is exactly 0 and the x-gradient is 0 in exact arithmetic; rstd = 1/sqrt(eps) ~ 316
        // amplifies the rounding of the row sums, so that case gets an absolute tolerance of 1e-4.
        const test::Tolerance t = d == 1 ? test::Tolerance{row_tol(dt).rtol, 1e-4} : row_tol(dt);
        CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b}, t, t) ==
              "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor()); }, {x}, dt) ==
              "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], Tensor(), 1e-3); }, {x, w},
                       dt) == "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w}, dt) == "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], Tensor(), 1e-5); }, {x}, dt) == "");
      }
    }
    // bf16 activations with f32 parameters (mixed precision), and a non-contiguous x (transposed)
    const Tensor xb = test::random_input({6, 1000}, 450, DType::bf16);
    const Tensor wf = test::random_input({1000}, 451, DType::f32, 0.5, 1.5);
    const Tensor bf = test::random_input({1000}, 452, DType::f32);
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {xb, wf, bf},
                   DType::bf16) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {xb, wf}, DType::bf16) == "");
    const Tensor xt = test::random_input({1000, 6}, 453, DType::f32);
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0].transpose(0, 1), in[1], in[2]); },
                   {xt, wf, bf}, DType::f32) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0].transpose(0, 1), in[1]); }, {xt, wf},
                   DType::f32) == "");
  });
}

TEST_CASE("layer_norm and rms_norm backward on CUDA: many rows (split column sums), parameter-only gradients",
          "[gpu][rows][norm]") {
  each_norm_variant([&] {
    for (DType dt : {DType::f32, DType::bf16}) {
      // (16643, 384): the register-resident backward with fused parameter sums, several row groups per block,
      // several iterations per block and a last group with rows past the end
      for (const Shape& shape : {Shape{3001, 7}, Shape{700, 1000}, Shape{257, 4097}, Shape{16643, 384}}) {
        const int64_t d = shape[1];
        const Tensor x = test::random_input(shape, 900 + d, dt, -2.0, 3.0);
        const Tensor w = test::random_input({d}, 901 + d, dt, 0.5, 1.5);
        const Tensor b = test::random_input({d}, 902 + d, dt, -1.0, 1.0);
        INFO(dtype_name(dt) << " " << to_string(shape));
        // the parameter gradients sum thousands of rows: f32 accumulation against the CPU's double
        const test::Tolerance tol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
        CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                       row_tol(dt), tol) == "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w}, row_tol(dt), tol) ==
              "");
        // x as a constant: only the parameters need gradients
        CHECK(check_op([&](const std::vector<Tensor>& in) { return layer_norm(x.to(in[0].device()), in[0], in[1]); },
                       {w, b}, row_tol(dt), tol) == "");
        CHECK(check_op([&](const std::vector<Tensor>& in) { return rms_norm(x.to(in[0].device()), in[0]); }, {w},
                       row_tol(dt), tol) == "");
      }
    }
  });
}

// The norm backward's one-wave grid (blocks walk several row groups, loading the next group before reducing
// the current one) and the one-launch parameter-gradient sum that stores gw / gb in the parameters' own
// dtypes: ViT-like widths with few rows (fewer groups than blocks), many rows (many groups per block, a
// partial last group), f16, parameters of two different dtypes, and the non-fused column-sum path (odd D).
TEST_CASE("layer_norm and rms_norm backward on CUDA: prefetching grid, parameter gradients in their dtypes",
          "[gpu][rows][norm]") {
  each_norm_variant([&] {
    uint64_t seed = 5000;
    for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
      for (const Shape& shape : {Shape{3, 384}, Shape{9, 768}, Shape{5003, 768}, Shape{20001, 384}, Shape{1001, 385}}) {
        const int64_t d = shape[1];
        const Tensor x = test::random_input(shape, ++seed, dt, -2.0, 3.0);
        const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
        const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
        INFO(dtype_name(dt) << " " << to_string(shape));
        const test::Tolerance tol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
        CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                       row_tol(dt), tol) == "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w}, row_tol(dt), tol) ==
              "");
        // only the bias needs a gradient (weight a constant)
        CHECK(check_op([&](const std::vector<Tensor>& in) { return layer_norm(in[0], w.to(in[0].device()), in[1]); },
                       {x, b}, row_tol(dt), tol) == "");
      }
    }
    // bf16 activations, f32 weight and bf16 bias: gw and gb stored in different dtypes by one launch
    const Tensor x = test::random_input({4099, 384}, 5100, DType::bf16, -2.0, 3.0);
    const Tensor w = test::random_input({384}, 5101, DType::f32, 0.5, 1.5);
    const Tensor b = test::random_input({384}, 5102, DType::bf16, -1.0, 1.0);
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                   row_tol(DType::bf16), row_tol(DType::bf16)) == "");
    // bf16 parameters read as they are by the kernels: here views that start one element in (contiguous but
    // not 16-byte aligned, so the multi-pass kernels read them element by element)
    {
      const Tensor wl = test::random_input({385}, 5106, DType::bf16, 0.5, 1.5);
      const Tensor bl = test::random_input({385}, 5107, DType::bf16, -1.0, 1.0);
      CHECK(check_op([](const std::vector<Tensor>& in) {
              return layer_norm(in[0], slice(in[1], 0, 1, 385, 1), slice(in[2], 0, 1, 385, 1));
            }, {x, wl, bl}, row_tol(DType::bf16), row_tol(DType::bf16)) == "");
      CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], slice(in[1], 0, 1, 385, 1)); }, {x, wl},
                     row_tol(DType::bf16), row_tol(DType::bf16)) == "");
    }
    // f64: double partial sums and outputs
    const Tensor xd = test::random_input({2049, 768}, 5103, DType::f64, -2.0, 3.0);
    const Tensor wd = test::random_input({768}, 5104, DType::f64, 0.5, 1.5);
    const Tensor bd = test::random_input({768}, 5105, DType::f64, -1.0, 1.0);
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {xd, wd, bd},
                   DType::f64) == "");
  });
}

// Every norm kernel variant (Note [Staged norm kernels] in kernels/rows_staged.cuh) on the row shapes that pick their
// geometry: threads per row 1..256 with 1..4 packs per thread (bf16 D = 8, 16, 64, 72, 384, 520, 768, 1024,
// 4096, 8192; f32 / f64 likewise with their packs), several stages of row groups per block, rows past the end
// in the last group; widths that are not a multiple of a pack (1004 bf16, 4095, 385) or too long for the
// staged kernels (11008 bf16) fall back. Forward with and without parameters, rms_norm, and the backward with
// the parameter gradients; rows with a large common offset (the bf16 / f16 statistics are sums shifted by
// the row's first element) and with a far outlier in the first element (f32 / f64: two-pass statistics).
TEST_CASE("layer_norm and rms_norm on CUDA: old and staged kernels, every row geometry", "[gpu][rows][norm]") {
  each_norm_variant([&] {
    uint64_t seed = 7000;
    const std::vector<Shape> shapes = {{1037, 8},   {513, 16},   {301, 64},   {77, 72},  {2003, 384}, {1001, 385},
                                       {257, 520},  {1031, 768}, {129, 1004}, {65, 1024}, {33, 4095}, {41, 4096},
                                       {9, 8192},   {3, 11008}};
    for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
      for (const Shape& shape : shapes) {
        const int64_t d = shape[1];
        const Tensor x = test::random_input(shape, ++seed, dt, -4.0, 4.0);
        const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
        const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
        const Tensor wf = test::random_input({d}, ++seed, DType::f32, 0.5, 1.5);
        const Tensor bf = test::random_input({d}, ++seed, DType::f32, -1.0, 1.0);
        const Tensor xc = x.to(test::kCuda);
        INFO(dtype_name(dt) << " " << to_string(shape));
        const test::Tolerance tol = row_tol(dt);
        auto check = [&](const Tensor& actual, const Tensor& expected, const char* what) {
          INFO(what);
          CHECK(test::compare_to_cpu(actual, expected, tol) == "");
        };
        {
          test::PoisonGuard poison;
          check(layer_norm(xc, w.to(test::kCuda), b.to(test::kCuda)), layer_norm(x, w, b), "layer_norm");
          check(layer_norm(xc, wf.to(test::kCuda), bf.to(test::kCuda)), layer_norm(x, wf, bf), "layer_norm, f32 parameters");
          check(layer_norm(xc, Tensor(), Tensor()), layer_norm(x, Tensor(), Tensor()), "layer_norm without affine");
          check(layer_norm(xc, w.to(test::kCuda), Tensor()), layer_norm(x, w, Tensor()), "layer_norm, weight only");
          check(rms_norm(xc, w.to(test::kCuda)), rms_norm(x, w), "rms_norm");
          check(rms_norm(xc, Tensor()), rms_norm(x, Tensor()), "rms_norm without weight");
        }
        if (shape[0] * d > 2'000'000) continue;  // the backward on the smaller shapes
        const test::Tolerance gtol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : tol;
        CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b}, tol,
                       gtol) == "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), in[1]); }, {x, b}, tol,
                       gtol) == "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w}, tol, gtol) == "");
        CHECK(check_op([](const std::vector<Tensor>& in) { return rms_norm(in[0], Tensor()); }, {x}, tol, gtol) == "");
      }
      // a large common offset in every row, packable (768: staged or register-resident kernels) and not (767:
      // the multi-pass kernels). The weight gradient sums g * xhat over the 300 rows, so a bias in the row means
      // adds up: a plain float sum of f16 values near 100 gave means off by up to 5e-6 and weight gradients off
      // by up to 1.5e-3 (23 of 768 columns over the tolerance, run 18); every bf16 / f16 kernel now sums x minus
      // the row's first element (Note [Shifted row mean] in kernels/rows_common.cuh).
      for (const int64_t d : {int64_t{768}, int64_t{767}}) {
        // (100 for bf16 / f16; 10 for f32 / f64, whose kernels sum x itself: the float mean of values near 100
        // would carry more rounding than the f32 tolerance)
        const double offset = dt == DType::bf16 || dt == DType::f16 ? 100.0 : 10.0;
        const Tensor x = add(test::random_input({300, d}, ++seed, DType::f64, -1.0, 1.0), offset).to(dt);
        const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
        const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
        INFO(dtype_name(dt) << " offset rows, D " << d);
        CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                       row_tol(dt), dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt)) == "");
      }
      // an outlier as the first element of every row
      {
        std::vector<double> v = test::random_input({50, 4096}, ++seed, DType::f64, -1.0, 1.0).to_vector<double>();
        for (int64_t r = 0; r < 50; ++r) v[static_cast<std::size_t>(r * 4096)] = dt == DType::f16 ? 300.0 : 1000.0;
        const Tensor x = from_vector(v, {50, 4096}).to(dt);
        INFO(dtype_name(dt) << " outlier first");
        CHECK(test::compare_to_cpu(layer_norm(x.to(test::kCuda), Tensor(), Tensor()), layer_norm(x, Tensor(), Tensor()),
                                   row_tol(dt)) == "");
      }
    }
    // NaN / inf in x and in the parameters (rows and columns of NaN results, pack_cast's check), both parameter
    // dtypes
    const double inf = INFINITY, nan = NAN;
    for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
      for (DType pdt : {dt, DType::f32}) {
        Tensor x = test::random_input({9, 768}, ++seed, dt, -2.0, 2.0);
        std::vector<double> xv = x.to_vector<double>();
        xv[3 * 768 + 17] = nan;  // row 3: NaN everywhere
        xv[5 * 768 + 700] = inf;  // row 5: NaN everywhere (inf - mean)
        x = from_vector(xv, {9, 768}).to(dt);
        std::vector<double> wv = test::random_input({768}, ++seed, DType::f64, 0.5, 1.5).to_vector<double>();
        std::vector<double> bv = test::random_input({768}, ++seed, DType::f64, -1.0, 1.0).to_vector<double>();
        wv[3] = nan;
        bv[700] = inf;
        wv[701] = inf;
        const Tensor w = from_vector(wv, {768}).to(pdt), b = from_vector(bv, {768}).to(pdt);
        INFO(dtype_name(dt) << " x, " << dtype_name(pdt) << " parameters, NaN / inf");
        CHECK(test::compare_to_cpu(layer_norm(x.to(test::kCuda), w.to(test::kCuda), b.to(test::kCuda)),
                                   layer_norm(x, w, b), row_tol(dt)) == "");
        CHECK(test::compare_to_cpu(rms_norm(x.to(test::kCuda), w.to(test::kCuda)), rms_norm(x, w), row_tol(dt)) == "");
      }
    }
  });
}

// Variants 2, 3 and 4 run the staged kernels for packable rows (no silent fallback, e.g. a failed shared-memory
// or occupancy query), variant 1 never does; unpackable rows fall back under every variant.
TEST_CASE("layer_norm on CUDA: variants 2 and 3 launch the staged kernels", "[gpu][rows][norm]") {
  const Tensor x = test::random_input({1000, 768}, 7600, DType::bf16, -2.0, 3.0);
  const Tensor w = test::random_input({768}, 7601, DType::bf16, 0.5, 1.5);
  const Tensor b = test::random_input({768}, 7602, DType::bf16, -1.0, 1.0);
  const Tensor xo = test::random_input({1000, 767}, 7603, DType::bf16, -2.0, 3.0);  // not a multiple of a pack
  for (int v = 1; v <= kernels::kNormKernelVariants; ++v) {
    NormVariant guard(v);
    INFO("norm kernel variant " << v);
    const kernels::NormStagedCounts before = kernels::norm_staged_counts();
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
                   DType::bf16) == "");
    const kernels::NormStagedCounts mid = kernels::norm_staged_counts();
    CHECK(mid.forward - before.forward == (v == 1 ? 0 : 1));
    CHECK(mid.backward - before.backward == (v == 1 ? 0 : 1));
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor()); }, {xo},
                   DType::bf16) == "");
    const kernels::NormStagedCounts after = kernels::norm_staged_counts();
    CHECK(after.forward == mid.forward);
    CHECK(after.backward == mid.backward);
  }
}

// The same inputs through every variant give results within rounding of each other, and each variant is
// deterministic (two runs bit-identical, parameter gradients included).
TEST_CASE("layer_norm on CUDA: each norm kernel variant is deterministic", "[gpu][rows][norm]") {
  const Tensor x0 = test::random_input({20001, 384}, 7500, DType::bf16, -2.0, 3.0).to(test::kCuda);
  const Tensor w0 = test::random_input({384}, 7501, DType::bf16, 0.5, 1.5).to(test::kCuda);
  const Tensor b0 = test::random_input({384}, 7502, DType::bf16, -1.0, 1.0).to(test::kCuda);
  const Tensor g = test::random_input({20001, 384}, 7503, DType::bf16, -1.0, 1.0).to(test::kCuda);
  auto run = [&] {
    Tensor x = x0.detach(), w = w0.detach(), b = b0.detach();
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    Tensor y = layer_norm(x, w, b);
    y.backward(g);
    return std::vector<Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
  };
  std::vector<std::vector<Tensor>> per_variant;
  each_norm_variant([&] {
    const std::vector<Tensor> a = run(), c = run();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("result " << i);
      CHECK(test::compare_bits(a[i], c[i].to(Device::cpu())) == "");
    }
    per_variant.push_back(a);
  });
  for (std::size_t v = 1; v < per_variant.size(); ++v)
    for (std::size_t i = 0; i < per_variant[0].size(); ++i) {
      INFO("result " << i << ", variant 1 against " << v + 1);
      CHECK(test::compare_to_cpu(per_variant[v][i], per_variant[0][i].to(Device::cpu()), row_tol(DType::bf16)) == "");
    }
  // variants 2 and 3 differ only in where the parameters are kept: the same arithmetic in the same order, and
  // here the same backward grid (both two blocks per SM: the per-block dgamma / dbeta partial sums match)
  REQUIRE(per_variant.size() == 4);
  for (std::size_t i = 0; i < per_variant[1].size(); ++i) {
    INFO("result " << i << ", variant 2 against 3");
    CHECK(test::compare_bits(per_variant[2][i], per_variant[1][i].to(Device::cpu())) == "");
  }
  // variant 4 has variant 2's forward here (384 wide) and the same x gradient arithmetic; only the order in
  // which the parameter gradients' per-block sums are added differs (checked against variant 1 above)
  for (std::size_t i = 0; i < 2; ++i) {
    INFO("result " << i << ", variant 2 against 4");
    CHECK(test::compare_bits(per_variant[3][i], per_variant[1][i].to(Device::cpu())) == "");
  }
}

// Variant 4 (Note [Norm backward, cluster variant] in kernels/rows_norm.cu) against variant 2 on the row groups of
// more than a warp (its named barriers per row group: 64, 128 and 256 threads per row) and of less (its
// shuffled row statistics): the x gradient bit for bit (the same arithmetic in the same order), the parameter
// gradients within rounding (another order of the per-block sums) and against the CPU reference; and on the
// 16384 x 4096 bf16 rows of the benchmark it writes fewer parameter-gradient partial rows (clusters of 2 or 4
// blocks: a failed cluster occupancy query would leave one per block).
TEST_CASE("layer_norm and rms_norm on CUDA: norm kernel variant 4 against variant 2", "[gpu][rows][norm]") {
  uint64_t seed = 7900;
  const std::vector<std::pair<DType, Shape>> cases = {
      {DType::bf16, {2003, 4096}}, {DType::bf16, {1001, 8192}}, {DType::bf16, {3001, 2048}}, {DType::f16, {777, 4096}},
      {DType::bf16, {5003, 768}},  {DType::f32, {1003, 1024}},  {DType::f32, {501, 4096}},   {DType::f64, {301, 2048}},
      {DType::bf16, {3, 4096}}};
  for (const auto& [dt, shape] : cases) {
    const int64_t d = shape[1];
    const Tensor x = test::random_input(shape, ++seed, dt, -3.0, 3.0);
    const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
    const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
    const Tensor gy = test::random_input(shape, ++seed, dt, -1.0, 1.0);
    INFO(dtype_name(dt) << " " << to_string(shape));
    for (const bool rms : {false, true}) {
      INFO((rms ? "rms_norm" : "layer_norm"));
      // the forward under variant 4 (the default's forward), the backward under bwd_variant
      auto run = [&](Device dv, int bwd_variant) {
        std::vector<Tensor> in = {x.to(dv).detach(), w.to(dv).detach(), b.to(dv).detach()};
        for (Tensor& t : in) t.set_requires_grad(true);
        Tensor y;
        {
          NormVariant guard(4);
          y = rms ? rms_norm(in[0], in[1]) : layer_norm(in[0], in[1], in[2]);
        }
        NormVariant guard(bwd_variant);
        y.backward(gy.to(dv));
        return std::vector<Tensor>{y.detach(), in[0].grad(), in[1].grad(), rms ? Tensor() : in[2].grad()};
      };
      const std::vector<Tensor> v2 = run(test::kCuda, 2);
      std::vector<Tensor> v4;
      {
        test::PoisonGuard poison;
        v4 = run(test::kCuda, 4);
      }
      const std::vector<Tensor> cpu = run(Device::cpu(), 4);
      const test::Tolerance gtol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
      for (std::size_t i = 0; i < cpu.size(); ++i) {
        if (!cpu[i].defined()) continue;
        INFO("result " << i << " (y, x's gradient, weight's, bias's)");
        CHECK(test::compare_to_cpu(v4[i], cpu[i], i == 0 ? row_tol(dt) : gtol) == "");
        if (i <= 1) CHECK(test::compare_bits(v4[i], v2[i].to(Device::cpu())) == "");
        if (i >= 2) CHECK(test::compare_to_cpu(v4[i], v2[i].to(Device::cpu()), gtol) == "");
      }
    }
  }
  // the partial rows of the benchmark's shape (only the pointers' alignment is looked at: small buffers)
  const Tensor buf = zeros({64}, {DType::bf16, test::kCuda});
  const Tensor stat = zeros({64}, {DType::f32, test::kCuda});
  kernels::NormBackwardArgs ba{DType::bf16, kernels::NormKind::layer, buf.data_ptr(), buf.data_ptr(), buf.data_ptr(),
                               stat.data_ptr(), stat.data_ptr(), buf.data_ptr(), 16384, 4096};
  ba.weight_narrow = true;
  int parts[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    NormVariant guard(k == 0 ? 2 : 4);
    parts[k] = kernels::norm_backward_partials(ba);
  }
  INFO("partial rows: variant 2 " << parts[0] << ", variant 4 " << parts[1]);
  CHECK(parts[0] > 0);
  CHECK(parts[1] > 0);
  CHECK(parts[1] < parts[0]);
  CHECK(parts[1] * 4 >= parts[0]);
}

// Rows that start at an offset in their storage: 16-byte aligned (the staged kernels) and not (one element
// further: the multi-pass kernels), forward and backward with parameter gradients, every variant and dtype.
TEST_CASE("layer_norm and rms_norm on CUDA: rows at an offset in their storage", "[gpu][rows][norm]") {
  each_norm_variant([&] {
    uint64_t seed = 7700;
    for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
      for (const int64_t d : {int64_t{384}, int64_t{768}, int64_t{4096}}) {
        const int64_t rows = 37;
        for (const int64_t at : {int64_t{5} * d, int64_t{5} * d + 1}) {
          // the rows are elements [at, at + rows d) of a larger flat tensor (a view with a storage offset)
          const Tensor flat = test::random_input({at + rows * d + 3}, ++seed, dt, -3.0, 3.0);
          const Tensor w = test::random_input({d}, ++seed, dt, 0.5, 1.5);
          const Tensor b = test::random_input({d}, ++seed, dt, -1.0, 1.0);
          INFO(dtype_name(dt) << " D " << d << ", offset " << at);
          const Tensor gy = test::random_input({rows, d}, ++seed, dt, -1.0, 1.0);
          const test::Tolerance gtol = dt == DType::f32 ? test::Tolerance{1e-4, 1e-4} : row_tol(dt);
          // the same graph on both devices: leaves flat, w, b; y = layer_norm(flat[at : at + rows d] as (rows, d))
          auto run = [&](Device dv, bool rms) {
            std::vector<Tensor> in = {flat.to(dv).detach(), w.to(dv).detach(), b.to(dv).detach()};
            for (Tensor& t : in) t.set_requires_grad(true);
            const Tensor x = in[0].narrow(0, at, rows * d).view({rows, d});
            const Tensor y = rms ? rms_norm(x, in[1]) : layer_norm(x, in[1], in[2]);
            y.backward(gy.to(dv));
            return std::vector<Tensor>{y.detach(), in[0].grad(), in[1].grad(), rms ? Tensor() : in[2].grad()};
          };
          for (const bool rms : {false, true}) {
            INFO((rms ? "rms_norm" : "layer_norm"));
            const std::vector<Tensor> cpu = run(Device::cpu(), rms);
            std::vector<Tensor> gpu;
            {
              test::PoisonGuard poison;
              gpu = run(test::kCuda, rms);
            }
            for (std::size_t i = 0; i < cpu.size(); ++i) {
              if (!cpu[i].defined()) continue;
              INFO("result " << i << " (y, flat's gradient, weight's, bias's)");
              CHECK(test::compare_to_cpu(gpu[i], cpu[i], i == 0 ? row_tol(dt) : gtol) == "");
            }
          }
        }
      }
    }
  });
}

// Element indices past 2^31: 2^31 / D + 5 rows (bf16, D 768: the staged kernels with a warp per row; 4096: a
// block-wide reduction per row). All rows but the last five are zero (var 0, results = bias; their g is zero),
// so the last five rows, the x gradient there and the parameter gradients match the CPU reference of those
// five rows alone. About 17 GB of device memory.
TEST_CASE("layer_norm on CUDA: element indices past 2^31", "[gpu][rows][norm]") {
  for (const int64_t d : {int64_t{768}, int64_t{4096}}) {
    const int64_t rows = (int64_t{1} << 31) / d + 5, tail = 5;
    const Tensor xt = test::random_input({tail, d}, 7800 + d, DType::bf16, -2.0, 3.0);
    const Tensor gt = test::random_input({tail, d}, 7801 + d, DType::bf16, -1.0, 1.0);
    const Tensor w = test::random_input({d}, 7802 + d, DType::bf16, 0.5, 1.5);
    const Tensor b = test::random_input({d}, 7803 + d, DType::bf16, -1.0, 1.0);
    // the CPU reference of the last rows
    Tensor xr = xt.detach(), wr = w.detach(), br = b.detach();
    for (Tensor* t : {&xr, &wr, &br}) t->set_requires_grad(true);
    const Tensor yr = layer_norm(xr, wr, br);
    yr.backward(gt);
    each_norm_variant([&] {
      INFO("D " << d << ", rows " << rows);
      Tensor x = zeros({rows, d}, {DType::bf16, test::kCuda});
      copy_(x.narrow(0, rows - tail, tail), xt.to(test::kCuda));
      const Tensor g = zeros({rows, d}, {DType::bf16, test::kCuda});
      copy_(g.narrow(0, rows - tail, tail), gt.to(test::kCuda));
      Tensor wc = w.to(test::kCuda).detach(), bc = b.to(test::kCuda).detach();
      for (Tensor* t : {&x, &wc, &bc}) t->set_requires_grad(true);
      const Tensor y = layer_norm(x, wc, bc);
      y.backward(g);
      const test::Tolerance tol = row_tol(DType::bf16);
      CHECK(test::compare_to_cpu(y.detach().narrow(0, rows - tail, tail).contiguous(), yr.detach(), tol) == "");
      CHECK(test::compare_to_cpu(x.grad().narrow(0, rows - tail, tail).contiguous(), xr.grad(), tol) == "");
      CHECK(test::compare_to_cpu(wc.grad(), wr.grad(), tol) == "");
      CHECK(test::compare_to_cpu(bc.grad(), br.grad(), tol) == "");
      // a zero row: var 0, so y = bias there
      CHECK(test::compare_to_cpu(y.detach().narrow(0, 0, 1).view({d}).contiguous(), b, tol) == "");
    });
  }
}

// The register-resident softmax backward on many short rows: more row groups than blocks (grid-stride
// iterations) and a last group with rows past the end.
TEST_CASE("softmax and log_softmax backward on CUDA: many short rows", "[gpu][rows][softmax]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = test::random_input({70001, 16}, 970, dt, -3.0, 3.0);
    INFO(dtype_name(dt));
    CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], -1); }, {x}, dt) == "");
    // log_softmax's backward g - exp(y) sum(g) amplifies a one-ulp difference of the saved bf16 y (the fast
    // exp of the forward may round the other way at a tie): 2^-6 relative at y ~ -3, times sum(g) ~ 16 and
    // exp(y) ~ 0.04 is ~0.01 absolute, so the gradient gets an absolute tolerance of that size in bf16.
    test::Tolerance gtol = row_tol(dt);
    if (dt == DType::bf16) gtol.atol = 0.02;
    CHECK(check_op([](const std::vector<Tensor>& in) { return log_softmax(in[0], -1); }, {x}, row_tol(dt), gtol) == "");
  }
}

TEST_CASE("embedding on CUDA gathers rows and sums the gradients of repeated ids", "[gpu][rows][embedding]") {
  uint64_t seed = 500;
  // ids drawn from 0..9 of a 50-row table: every used id repeats
  const std::vector<int64_t> idv = test::random_input({4 * 33}, 501, DType::i64, 0, 9).to_vector<int64_t>();
  for (DType dt : kDTypes) {
    for (int64_t d : {int64_t{1}, int64_t{7}, int64_t{1000}}) {
      const Tensor w = test::random_input({50, d}, ++seed, dt);
      for (DType idt : {DType::i64, DType::i32}) {
        INFO(dtype_name(dt) << " D " << d << " ids " << dtype_name(idt));
        const Tensor ids = ids_tensor(idv, {4, 33}, idt);
        // the gradient sums up to ~13 rows per id in f32 in a varying order (atomicAdd): not bit-stable
        CHECK(check_op([](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); }, {w, ids}, dt) == "");
      }
    }
  }
  // a non-contiguous table (the transpose of a (D, V) tensor) and integer tables (bit copies)
  const Tensor wt = test::random_input({7, 50}, 550, DType::f32);
  const Tensor ids = ids_tensor(idv, {4, 33}, DType::i64);
  CHECK(check_op([](const std::vector<Tensor>& in) { return embedding(in[0].transpose(0, 1), in[1]); }, {wt, ids},
                 DType::f32) == "");
  for (DType dt : {DType::i64, DType::u8, DType::b8, DType::f8e4m3}) {
    INFO(dtype_name(dt));
    const Tensor w = test::random_input({50, 5}, 551, dt);
    CHECK(test::compare_bits(embedding(w.to(test::kCuda), ids.to(test::kCuda)), embedding(w, ids)) == "");
  }
}

TEST_CASE("embedding on CUDA rejects out-of-range ids (checked on the device)", "[gpu][rows][embedding]") {
  const Tensor w = test::random_input({10, 4}, 600, DType::f32).to(test::kCuda);
  for (int64_t bad : {10, -1}) {
    const Tensor ids = ids_tensor({1, 2, 3, bad, 4, bad}, {2, 3}, DType::i64).to(test::kCuda);
    CHECK_THROWS_WITH(embedding(w, ids), HasSubstr("id " + std::to_string(bad) +
                                                                   " (at flat position 3) is out of range"));
  }
}

TEST_CASE("max and argmax on CUDA pick the first maximal element, NaN first", "[gpu][rows][max]") {
  uint64_t seed = 700;
  for (DType dt : test::all_dtypes()) {
    for (int64_t len : kLens) {
      // small integers: many ties per row
      const Tensor x = test::random_input({5, len}, ++seed, DType::i32, -3, 3).to(dt);
      for (int64_t dim : {int64_t{0}, int64_t{1}}) {
        INFO(dtype_name(dt) << " len " << len << " dim " << dim);
        const Tensor xc = x.to(test::kCuda);
        test::PoisonGuard poison;
        CHECK(test::compare_bits(argmax(xc, dim), argmax(x, dim)) == "");
        CHECK(test::compare_bits(max(xc, dim, KeepDim::yes), max(x, dim, KeepDim::yes)) == "");
        CHECK(test::compare_bits(argmax(xc.transpose(0, 1), 1 - dim), argmax(x.transpose(0, 1), 1 - dim)) == "");
      }
    }
  }
  // NaN wins over everything and the first NaN is chosen; -inf rows pick their first element
  const double nan = NAN, inf = INFINITY;
  const Tensor x = from_vector(std::vector<double>{1, nan, 3, nan, 2, 5, 5, 1, -inf, -inf, -inf, -inf, inf, 0, inf, 1},
                               {4, 4});
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::f16, DType::f8e5m2}) {
    INFO(dtype_name(dt));
    const Tensor xd = x.to(dt);
    CHECK(test::compare_bits(argmax(xd.to(test::kCuda), 1), argmax(xd, 1)) == "");
    // values as values: a NaN may come back as another NaN code through the f32 compute dtype of fp8
    CHECK(test::compare_to_cpu(max(xd.to(test::kCuda), 1), max(xd, 1)) == "");
    CHECK(argmax(xd.to(test::kCuda), 1).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 0, 0});
  }
  // many rows (the grid-stride loop) and the all-element max
  const Tensor many = test::random_input({70001, 3}, 710, DType::i32, -3, 3).to(DType::f32);
  CHECK(test::compare_bits(argmax(many.to(test::kCuda), 1), argmax(many, 1)) == "");
  CHECK(test::compare_bits(max(many.to(test::kCuda)), max(many)) == "");
}

TEST_CASE("max on CUDA: the gradient goes to the first maximal element", "[gpu][rows][max]") {
  for (DType dt : kDTypes) {
    const Tensor x = test::random_input({6, 1000}, 800, DType::i32, -5, 5).to(dt);
    INFO(dtype_name(dt));
    CHECK(check_op([](const std::vector<Tensor>& in) { return max(in[0], 1); }, {x}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return max(in[0], 0, KeepDim::yes); }, {x}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return max(in[0]); }, {x}, dt) == "");
  }
}

// Register-resident row kernels (rows.cu, rows_norm_cached.cu: a row of up to 512 x 8 16-byte packs is held in registers by a
// group of 32..512 threads) and the multi-pass kernels beyond that: long rows (transformer widths 4096, 8192,
// 11008), rows that are not a multiple of a 16-byte pack (unaligned row starts), several rows per block with
// a partial last block, and rows too long for registers (40000 elements in every dtype; 32768 bf16 is the
// largest register-resident row). Forward results against the CPU; one width also through backward.
TEST_CASE("softmax, log_softmax, layer_norm and rms_norm on CUDA: long and odd rows", "[gpu][rows][long]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{301, 4096}, {3, 8192}, {5, 11008}, {7, 4095},
                                                           {129, 2048}, {33, 520},  {2, 40000}, {1, 32768},
                                                           {4, 16385}};
  uint64_t seed = 1200;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const auto& [rows, len] : shapes) {
      const Tensor x = test::random_input({rows, len}, ++seed, dt, -4.0, 4.0);
      const Tensor w = test::random_input({len}, ++seed, DType::f32, 0.5, 1.5);
      const Tensor b = test::random_input({len}, ++seed, DType::f32, -1.0, 1.0);
      const Tensor xc = x.to(test::kCuda), wc = w.to(test::kCuda), bc = b.to(test::kCuda);
      INFO(dtype_name(dt) << " " << rows << " x " << len);
      const test::Tolerance tol = row_tol(dt);
      auto check = [&](const Tensor& actual, const Tensor& expected, const char* what) {
        INFO(what);
        CHECK(test::compare_to_cpu(actual, expected, tol) == "");
      };
      test::PoisonGuard poison;
      check(softmax(xc, 1), softmax(x, 1), "softmax");
      check(log_softmax(xc, -1), log_softmax(x, -1), "log_softmax");
      check(layer_norm(xc, wc, bc), layer_norm(x, w, b), "layer_norm");
      check(layer_norm(xc, Tensor(), Tensor()), layer_norm(x, Tensor(), Tensor()), "layer_norm without affine");
      check(rms_norm(xc, wc), rms_norm(x, w), "rms_norm");
      // a row view that starts one element in: every row start is misaligned for 16-byte packs
      const Tensor xs = slice(x, 1, 1, len, 1), xsc = slice(xc, 1, 1, len, 1);
      check(softmax(xsc, 1), softmax(xs, 1), "softmax of a sliced view");
      check(layer_norm(xsc, Tensor(), Tensor()), layer_norm(xs, Tensor(), Tensor()), "layer_norm of a sliced view");
    }
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = test::random_input({9, 4096}, 1300, dt, -4.0, 4.0);
    const Tensor w = test::random_input({4096}, 1301, dt, 0.5, 1.5);
    const Tensor b = test::random_input({4096}, 1302, dt, -1.0, 1.0);
    INFO(dtype_name(dt) << " backward, rows of 4096");
    CHECK(check_op([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {x}, dt) == "");
    CHECK(check_op([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b}, dt) == "");
  }
}
