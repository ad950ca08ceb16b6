// cuDNN handle, descriptors and 2-D convolution (see include/hadatrain/cuda/cudnn.h and
// Note [cuDNN math and algorithms] there).
#include "hadatrain/cuda/cudnn.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "hadatrain/cuda/context.h"
#include "hadatrain/tensor/dtype.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::cuda {
namespace {

const char* basename_of(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

constexpr int kMaxCudnnDevices = 64;

// This thread's handles, one per device; destroyed when the thread ends.
struct CudnnHandles {
  std::array<cudnnHandle_t, kMaxCudnnDevices> h{};
  ~CudnnHandles() {
    for (cudnnHandle_t x : h)
      if (x) (void)cudnnDestroy(x);
  }
};

int to_int(int64_t v, const char* what) {
  HT_CHECK(v >= 0 && v <= INT32_MAX, "cuDNN convolution: {} = {} does not fit in 32 bits", what, v);
  return static_cast<int>(v);
}

}  // namespace

void throw_cudnn_error(const char* file, int line, const char* expr, cudnnStatus_t status) {
  throw CudaError(fmt::format("cuDNN error: {} failed with {} [{}:{}]", expr, cudnnGetErrorString(status),
                              basename_of(file), line),
                  static_cast<int>(status));
}

cudnnHandle_t cudnn_handle() {
  thread_local CudnnHandles handles;
  const int d = current_device();
  HT_CHECK(d >= 0 && d < kMaxCudnnDevices, "cudnn_handle: device index {} out of range", d);
  cudnnHandle_t& h = handles.h[static_cast<std::size_t>(d)];
  if (!h) HT_CUDNN_CHECK(cudnnCreate(&h));
  HT_CUDNN_CHECK(cudnnSetStream(h, current_stream(d)));
  return h;
}

cudnnDataType_t cudnn_dtype(DType dt, const char* op) {
  switch (dt) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    default: break;
  }
  HT_FAIL("{}: cuDNN supports f32, f64, bf16 and f16 on CUDA, got {}; convert with .to()", op, dtype_name(dt));
}

TensorDesc::TensorDesc() { HT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_)); }
TensorDesc::~TensorDesc() { (void)cudnnDestroyTensorDescriptor(d_); }
void TensorDesc::set_nchw(cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w) {
  set_4d(dt, TensorFormat::nchw, n, c, h, w);
}
void TensorDesc::set_4d(cudnnDataType_t dt, TensorFormat f, int64_t n, int64_t c, int64_t h, int64_t w) {
  const cudnnTensorFormat_t fmt = f == TensorFormat::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  HT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_, fmt, dt, to_int(n, "N"), to_int(c, "C"), to_int(h, "H"),
                                            to_int(w, "W")));
}

FilterDesc::FilterDesc() { HT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_)); }
FilterDesc::~FilterDesc() { (void)cudnnDestroyFilterDescriptor(d_); }
void FilterDesc::set(cudnnDataType_t dt, int64_t o, int64_t c, int64_t kh, int64_t kw, TensorFormat f) {
  const cudnnTensorFormat_t fmt = f == TensorFormat::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  HT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d_, dt, fmt, to_int(o, "O"), to_int(c, "C/groups"), to_int(kh, "KH"),
                                            to_int(kw, "KW")));
}

ConvDesc::ConvDesc() { HT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_)); }
ConvDesc::~ConvDesc() { (void)cudnnDestroyConvolutionDescriptor(d_); }

namespace {

enum class ConvPass { forward, backward_data, backward_filter };

// Descriptors of one problem, math type set (Note [cuDNN math and algorithms]).
struct ConvDescs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  cudnnMathType_t math = CUDNN_FMA_MATH;

  explicit ConvDescs(const ConvProblem& p) {
    const cudnnDataType_t dt = cudnn_dtype(p.dtype, "conv2d");
    x.set_4d(dt, p.format, p.N, p.C, p.H, p.W);
    y.set_4d(dt, p.format, p.N, p.O, p.OH, p.OW);
    w.set(dt, p.O, p.C / p.groups, p.KH, p.KW, p.format);
    const cudnnDataType_t compute = p.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    HT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.get(), to_int(p.pad_h, "pad_h"), to_int(p.pad_w, "pad_w"),
                                                   to_int(p.stride_h, "stride_h"), to_int(p.stride_w, "stride_w"),
                                                   to_int(p.dilation_h, "dilation_h"),
                                                   to_int(p.dilation_w, "dilation_w"), CUDNN_CROSS_CORRELATION,
                                                   compute));
    HT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), to_int(p.groups, "groups")));
    math = p.dtype == DType::f32   ? CUDNN_FMA_MATH
           : p.dtype == DType::f64 ? CUDNN_DEFAULT_MATH
                                   : CUDNN_TENSOR_OP_MATH;
    HT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math));
  }
  // The math type an algorithm was chosen with (Find may report another than the one requested).
  void use_math(cudnnMathType_t m) {
    if (m != math) HT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), m));
    math = m;
  }
};

// The algorithm chosen for one (pass, problem, device), its workspace size and math type.
struct AlgoChoice {
  int algo = 0;
  std::size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

using ConvKey = std::array<int64_t, 20>;

ConvKey key_of(ConvPass pass, const ConvProblem& p, int device) {
  return {static_cast<int64_t>(pass), static_cast<int64_t>(p.dtype), static_cast<int64_t>(p.format), device,
          p.N, p.C, p.H, p.W, p.O, p.KH, p.KW, p.OH, p.OW, p.stride_h, p.stride_w, p.pad_h, p.pad_w,
          p.dilation_h, p.dilation_w, p.groups};
}

// cuDNN 9 groups its statuses in thousands: 2xxx bad parameter, 3xxx not supported. Either, for one
// algorithm, means "try another one" (an NHWC layout or a dtype that this algorithm does not take).
bool unsupported(cudnnStatus_t st) {
  const int family = static_cast<int>(st) / 1000;
  return family == 2 || family == 3;
}

// Workspace for a Find pass: up to 1 GiB, less when the caching allocator cannot give that much (down to
// 4 MiB, then none: algorithms that need a workspace are then skipped by Find).
constexpr std::size_t kFindWorkspaceMax = std::size_t{1} << 30;
constexpr std::size_t kFindWorkspaceMin = std::size_t{4} << 20;

std::mutex g_algo_mutex;
std::map<ConvKey, AlgoChoice>& algo_cache() {
  static std::map<ConvKey, AlgoChoice> cache;
  return cache;
}

// Workspace of `bytes` from the caching allocator, on the current device (freed in stream order).
Tensor workspace(std::size_t bytes) {
  if (bytes == 0) return Tensor();
  return empty({static_cast<int64_t>(bytes)}, {DType::u8, Device::cuda(current_device())});
}

// alpha = 1, beta = 0 in the scaling type cuDNN expects (double for f64 data, float otherwise).
struct Scaling {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  bool dbl;
  explicit Scaling(DType dt) : dbl(dt == DType::f64) {}
  const void* one() const { return dbl ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1); }
  const void* zero() const { return dbl ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0); }
};

Tensor find_workspace(std::size_t* bytes) {
  for (std::size_t b = kFindWorkspaceMax; b >= kFindWorkspaceMin; b /= 4) {
    try {
      Tensor ws = workspace(b);
      *bytes = b;
      return ws;
    } catch (const Error&) {  // out of memory: ask for less
    }
  }
  *bytes = 0;
  return Tensor();
}

void remember(const ConvKey& key, const AlgoChoice& c) {
  std::lock_guard<std::mutex> lock(g_algo_mutex);
  algo_cache()[key] = c;
}

// Runs one pass: with the cached algorithm; or else measures every algorithm once with
// `find(perfs_out, count_out, ws, bytes)` (cudnnFind*AlgorithmEx, fastest first) and runs and caches the
// fastest that succeeded (f32 kept on FMA math, Note [cuDNN math and algorithms]); or, when Find is off or
// fails or offers nothing usable, takes the heuristic's candidates in order (those that succeeded in the
// heuristic), skipping any whose workspace query or execution reports an unsupported configuration, and
// caches the first that runs. `heuristic(perfs_out, count_out)` fills cuDNN's perf structs;
// `workspace_of(algo, bytes*)` and `run(algo, ws, bytes)` return the cuDNN status. Returns false when no
// algorithm ran an nhwc problem (nchw throws).
// With `accumulate` (backward data into an existing gradient, beta = 1) an algorithm that reports an
// unsupported configuration makes it return false instead of throwing (the caller then adds separately); Find
// measures on a scratch output (the find lambda's job), since it overwrites the buffer it is given.
template <class Perf, int kCount, class Heuristic, class WorkspaceOf, class Run, class Find>
bool run_pass(ConvPass pass, const ConvProblem& p, const char* what, ConvDescs& d, Heuristic&& heuristic,
              WorkspaceOf&& workspace_of, Run&& run, Find&& find, bool accumulate = false) {
  using Algo = decltype(Perf{}.algo);
  const ConvKey key = key_of(pass, p, current_device());
  AlgoChoice cached;
  bool hit = false;
  {
    std::lock_guard<std::mutex> lock(g_algo_mutex);
    auto it = algo_cache().find(key);
    if (it != algo_cache().end()) {
      cached = it->second;
      hit = true;
    }
  }
  if (hit) {
    d.use_math(cached.math);
    const Tensor ws = workspace(cached.workspace);
    const cudnnStatus_t rs = run(static_cast<Algo>(cached.algo), ws.defined() ? ws.data_ptr() : nullptr,
                                 cached.workspace);
    if (accumulate && unsupported(rs)) return false;
    HT_CUDNN_CHECK(rs);
    return true;
  }
  const cudnnMathType_t requested = d.math;
  if (cudnn_find_enabled()) {
    std::vector<Perf> found(kCount);
    int n = 0;
    std::size_t find_bytes = 0;
    cudnnStatus_t st;
    {
      const Tensor ws = find_workspace(&find_bytes);
      st = find(found.data(), &n, ws.defined() ? ws.data_ptr() : nullptr, find_bytes);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
      for (int i = 0; i < n; ++i) {
        const Perf& pf = found[static_cast<std::size_t>(i)];
        if (pf.status != CUDNN_STATUS_SUCCESS || pf.memory > find_bytes) continue;
        // f32 keeps FMA math whatever Find reports (it measured with FMA math set; as PyTorch does without TF32).
        const cudnnMathType_t math = p.dtype == DType::f32 ? CUDNN_FMA_MATH : pf.mathType;
        d.use_math(math);
        const Tensor ws = workspace(pf.memory);
        const cudnnStatus_t rs = run(pf.algo, ws.defined() ? ws.data_ptr() : nullptr, pf.memory);
        if (unsupported(rs)) continue;
        HT_CUDNN_CHECK(rs);
        remember(key, {static_cast<int>(pf.algo), pf.memory, math});
        return true;
      }
    } else if (!unsupported(st)) {
      HT_CUDNN_CHECK(st);  // a real failure (e.g. an illegal address), not "this layout is unsupported"
    }
    d.use_math(requested);
  }
  std::vector<Perf> perfs(kCount);
  int n = 0;
  const cudnnStatus_t hs = heuristic(perfs.data(), &n);
  if (unsupported(hs) && (p.format == TensorFormat::nhwc || accumulate)) return false;
  HT_CUDNN_CHECK(hs);
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  for (int i = 0; i < n; ++i) {
    const Perf& pf = perfs[static_cast<std::size_t>(i)];
    if (pf.status != CUDNN_STATUS_SUCCESS) continue;
    std::size_t bytes = 0;
    last = workspace_of(pf.algo, &bytes);
    if (last != CUDNN_STATUS_SUCCESS) continue;
    const Tensor ws = workspace(bytes);
    last = run(pf.algo, ws.defined() ? ws.data_ptr() : nullptr, bytes);
    if (unsupported(last)) continue;
    HT_CUDNN_CHECK(last);
    remember(key, {static_cast<int>(pf.algo), bytes, requested});
    return true;
  }
  if (p.format == TensorFormat::nhwc || accumulate) return false;
  HT_FAIL("conv2d: cuDNN ran none of its {} heuristic {} algorithms for {} x ({}, {}, {}, {}) with weight ({}, {}, "
          "{}, {}), groups {} (last status: {})",
          n, what, dtype_name(p.dtype), p.N, p.C, p.H, p.W, p.O, p.C / p.groups, p.KH, p.KW, p.groups,
          cudnnGetErrorString(last));
}

}  // namespace

bool cudnn_find_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("HADATRAIN_CUDNN_FIND");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

bool conv2d_forward(const ConvProblem& p, const void* x, const void* w, void* y) {
  cudnnHandle_t h = cudnn_handle();
  ConvDescs d(p);
  const Scaling s(p.dtype);
  return run_pass<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
      ConvPass::forward, p, "forward", d,
      [&](cudnnConvolutionFwdAlgoPerf_t* perfs, int* n) {
        return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, perfs);
      },
      [&](cudnnConvolutionFwdAlgo_t a, std::size_t* b) {
        return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), a, b);
      },
      [&](cudnnConvolutionFwdAlgo_t a, void* ws, std::size_t bytes) {
        return cudnnConvolutionForward(h, s.one(), d.x.get(), x, d.w.get(), w, d.conv.get(), a, ws, bytes, s.zero(),
                                       d.y.get(), y);
      },
      [&](cudnnConvolutionFwdAlgoPerf_t* perfs, int* n, void* ws, std::size_t bytes) {
        return cudnnFindConvolutionForwardAlgorithmEx(h, d.x.get(), x, d.w.get(), w, d.conv.get(), d.y.get(), y,
                                                      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, perfs, ws, bytes);
      });
}

bool conv2d_backward_data(const ConvProblem& p, const void* dy, const void* w, void* dx, bool accumulate) {
  cudnnHandle_t h = cudnn_handle();
  ConvDescs d(p);
  const Scaling s(p.dtype);
  return run_pass<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
      ConvPass::backward_data, p, "backward-data", d,
      [&](cudnnConvolutionBwdDataAlgoPerf_t* perfs, int* n) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, perfs);
      },
      [&](cudnnConvolutionBwdDataAlgo_t a, std::size_t* b) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), a, b);
      },
      [&](cudnnConvolutionBwdDataAlgo_t a, void* ws, std::size_t bytes) {
        return cudnnConvolutionBackwardData(h, s.one(), d.w.get(), w, d.y.get(), dy, d.conv.get(), a, ws, bytes,
                                            accumulate ? s.one() : s.zero(), d.x.get(), dx);
      },
      [&](cudnnConvolutionBwdDataAlgoPerf_t* perfs, int* n, void* ws, std::size_t bytes) {
        // Find writes its output: when dx holds a gradient to accumulate into, it measures on a scratch copy.
        Tensor scratch;
        if (accumulate) {
          const int64_t elems = p.N * p.C * p.H * p.W;
          scratch = empty({elems}, {p.dtype, Device::cuda(current_device())});
        }
        return cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w.get(), w, d.y.get(), dy, d.conv.get(), d.x.get(),
                                                           accumulate ? scratch.data_ptr() : dx,
                                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, perfs, ws,
                                                           bytes);
      },
      accumulate);
}

bool conv2d_backward_filter(const ConvProblem& p, const void* x, const void* dy, void* dw) {
  cudnnHandle_t h = cudnn_handle();
  ConvDescs d(p);
  const Scaling s(p.dtype);
  return run_pass<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
      ConvPass::backward_filter, p, "backward-filter", d,
      [&](cudnnConvolutionBwdFilterAlgoPerf_t* perfs, int* n) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                                                             CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n, perfs);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t a, std::size_t* b) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), a,
                                                              b);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t a, void* ws, std::size_t bytes) {
        return cudnnConvolutionBackwardFilter(h, s.one(), d.x.get(), x, d.y.get(), dy, d.conv.get(), a, ws, bytes,
                                              s.zero(), d.w.get(), dw);
      },
      [&](cudnnConvolutionBwdFilterAlgoPerf_t* perfs, int* n, void* ws, std::size_t bytes) {
        return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x.get(), x, d.y.get(), dy, d.conv.get(),
                                                             d.w.get(), dw, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                             n, perfs, ws, bytes);
      });
}

}  // namespace ht::cuda
