// bench_kernels blocks of layout kernels: bench_fold (fold2d / unfold2d, im2col and back) and bench_pool
// (pooling, against cuDNN).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "bench_kernels.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/cuda/cudnn.h"  // bench_pool
#include "hadatrain/ops/ops.h"
#include "cuda/kernels/unfold.cuh"  // bench_fold: launch_fold2d / launch_unfold2d

namespace ht::bench {

// ---- bench_fold ----
// fold2d (col2im, unfold2d's backward) and unfold2d (im2col) kernels on ResNet / ViT shapes at batch 256 (one
// ImageNet-like stage-1 shape at batch 64), bf16, through the launchers on preallocated buffers (legacy stream,
// time_ms's events). fold: contiguous (N, L, C·kh·kw) columns -> (N, C, H, W) (the tiles kernel, Note [Fold,
// tiles kernel] in cuda/kernels/unfold_fold.cu, with the halo stage on the 3x3 stride-1 rows: Note [Fold, tiles2]);
// unfold (the vec kernel on every row here: Note [Unfold, vec kernel]) from an (N, C, H, W) contiguous image and from a channels-last (N, H, W, C) image viewed as NCHW (the HLQ convolutions'
// layout) -> columns. Bytes: columns + image, each once (the ideal traffic); "vs copy" is the ratio of that rate
// to the copy floor (the 1 GB clone of the main table). HADATRAIN_BENCH_FOLD=S runs only the cases whose name
// contains S.
void bench_fold(bool csv, double copy_gbs) {
  const Device dev = Device::cuda(0);
  Generator gen(21);
  struct Case {
    const char* name;
    int64_t N, C, H, W, k, s, p;
  };
  const Case cases[] = {
      {"C64 32x32 3x3 s1 p1", 256, 64, 32, 32, 3, 1, 1},    {"C128 16x16 3x3 s1 p1", 256, 128, 16, 16, 3, 1, 1},
      {"C256 8x8 3x3 s1 p1", 256, 256, 8, 8, 3, 1, 1},      {"C512 4x4 3x3 s1 p1", 256, 512, 4, 4, 3, 1, 1},
      {"C64 32x32 3x3 s2 p1", 256, 64, 32, 32, 3, 2, 1},    {"C128 16x16 1x1 s2", 256, 128, 16, 16, 1, 2, 0},
      {"C3 32x32 4x4 s4 (ViT-S/4)", 256, 3, 32, 32, 4, 4, 0}, {"C64 56x56 3x3 s1 p1 N64", 64, 64, 56, 56, 3, 1, 1},
  };
  const char* const only = std::getenv("HADATRAIN_BENCH_FOLD");
  if (csv) {
    std::printf("fold case (bf16 N 256 unless named),MB");
    for (const char* c : {"fold", "unfold nchw", "unfold nhwc-view"})
      std::printf(",%s ms,%s ratio_to_copy", c, c);
    std::printf("\n");
  } else {
    std::printf("\n%-30s %8s", "fold / unfold (bf16, N 256)", "MB");
    for (const char* c : {"fold", "unfold nchw", "unfold nhwc"})
      std::printf(" %11s %7s", c, "vs copy");
    std::printf("\n");
  }
  for (const Case& c : cases) {
    if (only != nullptr && std::string(c.name).find(only) == std::string::npos) continue;
    const int64_t N = c.N;
    kernels::UnfoldGeometry g;
    g.N = N;
    g.C = c.C;
    g.H = c.H;
    g.W = c.W;
    g.kh = g.kw = c.k;
    g.sh = g.sw = c.s;
    g.ph = g.pw = c.p;
    g.OH = (c.H + 2 * c.p - c.k) / c.s + 1;
    g.OW = (c.W + 2 * c.p - c.k) / c.s + 1;
    const int64_t L = g.OH * g.OW, K = c.C * c.k * c.k;
    const Tensor cols = rand({N, L, K}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor img = rand({N, c.C, c.H, c.W}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor nhwc = rand({N, c.H, c.W, c.C}, gen, {DType::f32, dev}).to(DType::bf16);
    const Tensor out_img = empty({N, c.C, c.H, c.W}, {DType::bf16, dev});
    const Tensor out_cols = empty({N, L, K}, {DType::bf16, dev});
    const kernels::FoldStrides3 cs{L * K, K, 1};
    double ms[3];
    ms[0] = time_ms([&] { kernels::launch_fold2d(DType::bf16, cols.data_ptr(), cs, g, out_img.data_ptr(), false, nullptr); });
    const kernels::UnfoldStrides4 xs{c.C * c.H * c.W, c.H * c.W, c.W, 1};
    const kernels::UnfoldStrides4 xl{c.H * c.W * c.C, 1, c.W * c.C, c.C};  // (n, c, h, w) strides of NHWC storage
    ms[1] = time_ms([&] { kernels::launch_unfold2d(DType::bf16, img.data_ptr(), xs, g, out_cols.data_ptr(), nullptr); });
    ms[2] = time_ms([&] { kernels::launch_unfold2d(DType::bf16, nhwc.data_ptr(), xl, g, out_cols.data_ptr(), nullptr); });
    const double bytes = 2.0 * static_cast<double>(N * L * K + N * c.C * c.H * c.W);
    if (csv) std::printf("%s,%.1f", c.name, bytes * 1e-6);
    else std::printf("%-30s %8.1f", c.name, bytes * 1e-6);
    for (double t : ms) {
      const double ratio = bytes / t * 1e-6 / copy_gbs;
      if (csv) std::printf(",%.4f,%.3f", t, ratio);
      else std::printf(" %11.4f %7.3f", t, ratio);
    }
    std::printf("\n");
  }
}
// ---- end bench_fold ----

// ---- bench_pool ----
// Pooling through the ops (forward without autograd; forward + backward through autograd), bf16, on the
// ResNet shapes PyTorch is compared with (tools/bench/bench_kernels_torch.py, block "pool", same names): the
// ImageNet stem's 3x3 stride-2 max pool and the heads' global average pools, each on an NCHW tensor and on a
// channels-last one (an (N, H, W, C) tensor viewed as (N, C, H, W), as the channels-last ResNets call it; its
// output and gradient stay channels last, and grad_out is made in the output's layout, as torch.rand_like).
// Pooling runs through whichever is faster, cuDNN or own kernels, so both are timed: ours are own kernels
// (cuda/kernels/pool*.cu); the cuDNN columns time cudnnPoolingForward and cudnnPoolingForward + cudnnPoolingBackward
// (which needs x, y and dy) on dense buffers of the same shapes and layout (CUDNN_POOLING_MAX 3x3 s2 p1;
// CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING with the whole plane as the window for the global pools), bare
// calls without autograd or allocation. cuDNN runs bf16 when it accepts it, else f16 (the "cuDNN dt" column).
// "max|diff|" compares cuDNN's forward output with ours (0 for max; one bf16 rounding for average).
// Bytes: input + output once each (forward); "GB/s" is ours over the forward time.

namespace {

struct PoolBenchCase {
  const char* name;
  int64_t N, C, H, W;
  bool max;  // 3x3 s2 p1 max pool; else adaptive average pool to 1x1
};

struct CudnnPoolTimes {
  double fwd = 0, both = 0, max_diff = 0;
  DType dtype = DType::bf16;
};

// Times cuDNN's pooling of x (logical (N, C, H, W), dense in its layout: NCHW, or channels last when cl) in
// x's dtype. Throws when cuDNN rejects the problem.
CudnnPoolTimes cudnn_pool_times(const PoolBenchCase& c, bool cl, const Tensor& x, const Tensor& ours, Generator& gen) {
  const cuda::TensorFormat fmt = cl ? cuda::TensorFormat::nhwc : cuda::TensorFormat::nchw;
  const cudnnDataType_t cdt = cuda::cudnn_dtype(x.dtype(), "bench_pool");
  const int64_t OH = ours.size(2), OW = ours.size(3);
  const int kh = c.max ? 3 : static_cast<int>(c.H), kw = c.max ? 3 : static_cast<int>(c.W);
  const int sh = c.max ? 2 : kh, sw = c.max ? 2 : kw, pad = c.max ? 1 : 0;
  cudnnPoolingDescriptor_t pd = nullptr;
  HT_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pd));
  CudnnPoolTimes r;
  r.dtype = x.dtype();
  try {
    HT_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
        pd, c.max ? CUDNN_POOLING_MAX : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, CUDNN_PROPAGATE_NAN, kh, kw, pad,
        pad, sh, sw));
    cuda::TensorDesc xd, yd;
    xd.set_4d(cdt, fmt, c.N, c.C, c.H, c.W);
    yd.set_4d(cdt, fmt, c.N, c.C, OH, OW);
    int on = 0, oc = 0, oh = 0, ow = 0;
    HT_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pd, xd.get(), &on, &oc, &oh, &ow));
    HT_CHECK(oh == OH && ow == OW, "bench_pool: cuDNN output {}x{}, ours {}x{}", oh, ow, OH, OW);
    // Dense buffers in the layout: y, dy (N, OH, OW, C) or (N, C, OH, OW); dx like x.
    const Shape ys = cl ? Shape{c.N, OH, OW, c.C} : Shape{c.N, c.C, OH, OW};
    const Shape xs = cl ? Shape{c.N, c.H, c.W, c.C} : Shape{c.N, c.C, c.H, c.W};
    Tensor y = empty(ys, {x.dtype(), x.device()}), dx = empty(xs, {x.dtype(), x.device()});
    const Tensor dy = rand(ys, gen, {DType::f32, x.device()}).to(x.dtype());
    const float alpha = 1.0f, beta = 0.0f;
    cudnnHandle_t h = cuda::cudnn_handle();
    auto fwd = [&] {
      HT_CUDNN_CHECK(cudnnPoolingForward(h, pd, &alpha, xd.get(), x.data_ptr(), &beta, yd.get(), y.data_ptr()));
    };
    auto bwd = [&] {
      HT_CUDNN_CHECK(cudnnPoolingBackward(h, pd, &alpha, yd.get(), y.data_ptr(), yd.get(), dy.data_ptr(), xd.get(),
                                          x.data_ptr(), &beta, xd.get(), dx.data_ptr()));
    };
    r.fwd = time_ms(fwd);
    r.both = time_ms([&] {
      fwd();
      bwd();
    });
    fwd();
    const Tensor yl = cl ? y.permute({0, 3, 1, 2}) : y;  // (N, C, OH, OW)
    const std::vector<float> a = yl.to(DType::f32).to_vector<float>(), b = ours.to(DType::f32).to_vector<float>();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
      r.max_diff = std::max(r.max_diff, d < 0 ? -d : d);
    }
  } catch (...) {
    cudnnDestroyPoolingDescriptor(pd);
    throw;
  }
  cudnnDestroyPoolingDescriptor(pd);
  return r;
}

}  // namespace

void bench_pool(bool csv) {
  const Device dev = Device::cuda(0);
  Generator gen(23);
  const PoolBenchCase cases[] = {{"max_pool 3x3 s2 64x64x112x112", 64, 64, 112, 112, true},
                                 {"avg_pool global 64x2048x7x7", 64, 2048, 7, 7, false},
                                 {"avg_pool global 256x512x4x4", 256, 512, 4, 4, false}};
  if (csv)
    std::printf("pool bf16,layout,fwd_ms,fwd_bwd_ms,cudnn_fwd_ms,cudnn_fwd_bwd_ms,fwd_GB/s,cudnn_dtype,max_diff\n");
  else
    std::printf("\n%-34s %-8s %10s %12s %11s %15s %10s %9s %9s\n", "pool (bf16)", "layout", "fwd ms", "fwd+bwd ms",
                "cuDNN fwd", "cuDNN fwd+bwd", "fwd GB/s", "cuDNN dt", "max|diff|");
  Tensor keep;
  for (const PoolBenchCase& c : cases) {
    for (const bool cl : {false, true}) {
      const Tensor xbuf = cl ? rand({c.N, c.H, c.W, c.C}, gen, {DType::f32, dev}).to(DType::bf16)
                             : rand({c.N, c.C, c.H, c.W}, gen, {DType::f32, dev}).to(DType::bf16);
      Tensor x = (cl ? permute(xbuf, {0, 3, 1, 2}) : xbuf).detach();
      Pool2dParams p;
      p.kernel_h = p.kernel_w = 3;
      p.stride_h = p.stride_w = 2;
      p.pad_h = p.pad_w = 1;
      auto run = [&] { return c.max ? max_pool2d(x, p) : adaptive_avg_pool2d(x, 1, 1); };
      Tensor y;
      {
        NoGradGuard no_grad;
        y = run();
      }
      // grad_out in the output's layout (torch.rand_like keeps channels_last)
      const Tensor g = cl ? permute(rand({c.N, y.size(2), y.size(3), c.C}, gen, {DType::f32, dev}).to(DType::bf16),
                                    {0, 3, 1, 2})
                          : rand(y.shape(), gen, {DType::f32, dev}).to(DType::bf16);
      const double fwd = time_ms([&] {
        NoGradGuard no_grad;
        keep = run();
      });
      x.set_requires_grad(true);
      const double both = time_ms([&] {
        x.zero_grad();
        run().backward(g);
      });
      x.set_requires_grad(false);
      CudnnPoolTimes cd;
      bool cudnn_ok = true;
      try {
        cd = cudnn_pool_times(c, cl, xbuf, y, gen);
      } catch (const std::exception& e) {
        try {  // cuDNN without bf16 pooling: f16, labelled
          cd = cudnn_pool_times(c, cl, xbuf.to(DType::f16), y, gen);
        } catch (const std::exception& e2) {
          std::fprintf(stderr, "bench_pool: cuDNN failed: %s / %s\n", e.what(), e2.what());
          cudnn_ok = false;
        }
      }
      const double bytes = 2.0 * static_cast<double>(x.numel() + y.numel());
      const std::string cdt = cudnn_ok ? std::string(dtype_name(cd.dtype)) : std::string("failed");
      if (csv)
        std::printf("%s,%s,%.4f,%.4f,%.4f,%.4f,%.1f,%s,%.3g\n", c.name, cl ? "nhwc" : "nchw", fwd, both, cd.fwd,
                    cd.both, bytes / fwd * 1e-6, cdt.c_str(), cd.max_diff);
      else
        std::printf("%-34s %-8s %10.4f %12.4f %11.4f %15.4f %10.1f %9s %9.3g\n", c.name, cl ? "nhwc" : "nchw", fwd,
                    both, cd.fwd, cd.both, bytes / fwd * 1e-6, cdt.c_str(), cd.max_diff);
    }
  }
}
// ---- end bench_pool ----

}  // namespace ht::bench
