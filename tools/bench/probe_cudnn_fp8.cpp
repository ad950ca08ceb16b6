// Which convolutions cuDNN runs on fp8 operands (CUDA builds): the evidence for how HLQ's conv products run in low precision.
// For the forward (fprop), the data gradient (dgrad) and the weight gradient (wgrad) of NHWC convolutions with e4m3
// operands, the probe builds cuDNN backend operation graphs in three forms: the convolution alone writing f32, the
// convolution alone writing bf16, and the convolution into a virtual f32 tensor scaled by a pointwise multiply into
// bf16 (the form of cuDNN's fp8 fprop sample, where the scales of the operands enter). For each form it reports
// whether cuDNN accepts the graph, how many of its engines finalise an execution plan (every global engine index is
// tried, not only the heuristics' list), and for an accepted form runs one plan on small integer levels (exact in
// e4m3; every product and sum exact in f32) and compares with a host reference, then times it on a ResNet-50 shape
// beside the same convolution in bf16. Only cuDNN's public backend API is used.
//   probe_cudnn_fp8 [batch for the timed shape, default 128]
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

// Exits with the call, its status and where, unless the status is `ok`.
#define CHECKED(x, ok, describe)                                                                     \
  do {                                                                                               \
    const auto s_ = (x);                                                                             \
    if (s_ != (ok)) {                                                                                \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #x, describe(s_));              \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)
#define CK(x) CHECKED(x, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)
#define CU(x) CHECKED(x, cudaSuccess, cudaGetErrorString)

using Desc = cudnnBackendDescriptor_t;

// A descriptor that destroys itself.
struct Owned {
  Desc d = nullptr;
  explicit Owned(cudnnBackendDescriptorType_t t) { CK(cudnnBackendCreateDescriptor(t, &d)); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
};

template <class V>
cudnnStatus_t set(Desc d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, const V* v, int64_t n = 1) {
  return cudnnBackendSetAttribute(d, a, t, n, v);
}

struct Conv {
  int64_t n, c, h, w, k, r, s, pad, stride;
  int64_t p() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t q() const { return (w + 2 * pad - s) / stride + 1; }
};

enum class Op { fprop, dgrad, wgrad };
const char* op_name(Op o) { return o == Op::fprop ? "fprop" : o == Op::dgrad ? "dgrad" : "wgrad"; }
enum class Form { f32_out, bf16_out, scaled_bf16_out };
const char* form_name(Form f) {
  return f == Form::f32_out ? "conv -> f32" : f == Form::bf16_out ? "conv -> bf16" : "conv -> f32 (virtual) * scale -> bf16";
}

// NHWC tensor descriptor of dims (n, c, h, w) in cuDNN's NCHW-ordered dims with channels-last strides.
void make_tensor(Owned& t, int64_t uid, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w,
                 bool is_virtual = false) {
  const int64_t dims[4] = {n, c, h, w}, strides[4] = {c * h * w, 1, c * w, c};
  const int64_t align = 16;
  CK(set(t.d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dt));
  CK(set(t.d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims, 4));
  CK(set(t.d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides, 4));
  CK(set(t.d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid));
  CK(set(t.d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align));
  CK(set(t.d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual));
  CK(cudnnBackendFinalize(t.d));
}

// Unique ids: 1 = x (image), 2 = w (filter), 3 = y (output / dy), 4 = the op's output before scaling, 5 = scale.
struct Graph {
  Owned x{CUDNN_BACKEND_TENSOR_DESCRIPTOR}, w{CUDNN_BACKEND_TENSOR_DESCRIPTOR}, y{CUDNN_BACKEND_TENSOR_DESCRIPTOR};
  Owned mid{CUDNN_BACKEND_TENSOR_DESCRIPTOR}, scale{CUDNN_BACKEND_TENSOR_DESCRIPTOR};
  Owned conv{CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR}, op{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR};
  Owned pw{CUDNN_BACKEND_POINTWISE_DESCRIPTOR}, pw_op{CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR};
  Owned graph{CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR};
  Graph(Op o, Form f, const Conv& cv, cudnnDataType_t in_dt, cudnnHandle_t handle, cudnnStatus_t& status)
      : op{o == Op::fprop   ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
           : o == Op::dgrad ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                            : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR} {
    const cudnnDataType_t out_dt = f == Form::f32_out ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16;
    // x, w, y keep the ids 1, 2, 3; the op's result (y, x or w) has out_dt, the other two in_dt. Scaled, the op
    // writes a virtual f32 tensor (id 4) that a pointwise multiply by the scale (id 5) turns into the result.
    const bool scaled = f == Form::scaled_bf16_out;
    const int result = o == Op::fprop ? 3 : o == Op::dgrad ? 1 : 2;
    make_tensor(x, 1, result == 1 ? out_dt : in_dt, cv.n, cv.c, cv.h, cv.w);
    make_tensor(w, 2, result == 2 ? out_dt : in_dt, cv.k, cv.c, cv.r, cv.s);
    make_tensor(y, 3, result == 3 ? out_dt : in_dt, cv.n, cv.k, cv.p(), cv.q());
    if (scaled) {
      if (result == 1) make_tensor(mid, 4, CUDNN_DATA_FLOAT, cv.n, cv.c, cv.h, cv.w, true);
      if (result == 2) make_tensor(mid, 4, CUDNN_DATA_FLOAT, cv.k, cv.c, cv.r, cv.s, true);
      if (result == 3) make_tensor(mid, 4, CUDNN_DATA_FLOAT, cv.n, cv.k, cv.p(), cv.q(), true);
      make_tensor(scale, 5, CUDNN_DATA_FLOAT, 1, 1, 1, 1);
    }
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dims = 2, one[2] = {1, 1}, stride[2] = {cv.stride, cv.stride}, pad[2] = {cv.pad, cv.pad};
    CK(set(conv.d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp));
    CK(set(conv.d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode));
    CK(set(conv.d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &dims));
    CK(set(conv.d, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, one, 2));
    CK(set(conv.d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride, 2));
    CK(set(conv.d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad, 2));
    CK(set(conv.d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pad, 2));
    CK(cudnnBackendFinalize(conv.d));
    const float alpha = 1.0f, beta = 0.0f;
    Desc xd = result == 1 && scaled ? mid.d : x.d, wd = result == 2 && scaled ? mid.d : w.d,
         yd = result == 3 && scaled ? mid.d : y.d;
    // The op's attribute names for its x, w, y ports (whichever it produces), descriptor, alpha and beta.
    struct Ports {
      cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
    };
    const Ports pt = o == Op::fprop ? Ports{CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA}
                     : o == Op::dgrad ? Ports{CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA}
                                      : Ports{CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                                              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
    CK(set(op.d, pt.x, CUDNN_TYPE_BACKEND_DESCRIPTOR, &xd));
    CK(set(op.d, pt.w, CUDNN_TYPE_BACKEND_DESCRIPTOR, &wd));
    CK(set(op.d, pt.y, CUDNN_TYPE_BACKEND_DESCRIPTOR, &yd));
    CK(set(op.d, pt.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, &conv.d));
    CK(set(op.d, pt.alpha, CUDNN_TYPE_FLOAT, &alpha));
    CK(set(op.d, pt.beta, CUDNN_TYPE_FLOAT, &beta));
    status = cudnnBackendFinalize(op.d);
    if (status != CUDNN_STATUS_SUCCESS) return;
    std::vector<Desc> ops{op.d};
    if (scaled) {
      const cudnnPointwiseMode_t mul = CUDNN_POINTWISE_MUL;
      CK(set(pw.d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mul));
      CK(set(pw.d, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &comp));
      CK(cudnnBackendFinalize(pw.d));
      Desc out = result == 1 ? x.d : result == 2 ? w.d : y.d;
      CK(set(pw_op.d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, &pw.d));
      CK(set(pw_op.d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &mid.d));
      CK(set(pw_op.d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &scale.d));
      CK(set(pw_op.d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &out));
      status = cudnnBackendFinalize(pw_op.d);
      if (status != CUDNN_STATUS_SUCCESS) return;
      ops.push_back(pw_op.d);
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CK(set(graph.d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle));
#pragma GCC diagnostic pop
    CK(set(graph.d, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(),
           static_cast<int64_t>(ops.size())));
    status = cudnnBackendFinalize(graph.d);
  }
};

// An execution plan of engine `index` for the graph, or null with the failing status.
struct Plan {
  Owned engine{CUDNN_BACKEND_ENGINE_DESCRIPTOR}, cfg{CUDNN_BACKEND_ENGINECFG_DESCRIPTOR};
  Owned plan{CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR};
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  int64_t workspace = 0;
  Plan(Graph& g, int64_t index, cudnnHandle_t handle) {
    CK(set(engine.d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &g.graph.d));
    CK(set(engine.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &index));
    if ((status = cudnnBackendFinalize(engine.d)) != CUDNN_STATUS_SUCCESS) return;
    CK(set(cfg.d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, &engine.d));
    if ((status = cudnnBackendFinalize(cfg.d)) != CUDNN_STATUS_SUCCESS) return;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CK(set(plan.d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle));
#pragma GCC diagnostic pop
    CK(set(plan.d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &cfg.d));
    if ((status = cudnnBackendFinalize(plan.d)) != CUDNN_STATUS_SUCCESS) return;
    int64_t got = 0;
    CK(cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &workspace));
  }
  bool ok() const { return status == CUDNN_STATUS_SUCCESS; }
};

// e4m3 bits of an integer level |v| <= 15 (exact: at most 4 significant bits).
uint8_t e4m3_of_int(int v) {
  if (v == 0) return 0;
  const int a = std::abs(v);
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  const int mant = ((a << 3) >> e) & 7;
  return static_cast<uint8_t>((v < 0 ? 0x80 : 0) | ((e + 7) << 3) | mant);
}
float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Host reference of the op on NHWC integer levels (exact in double, and in f32 for these sizes).
std::vector<double> reference(Op o, const Conv& cv, const std::vector<int>& xs, const std::vector<int>& ws,
                              const std::vector<int>& ys) {
  const int64_t P = cv.p(), Q = cv.q();
  auto X = [&](int64_t n, int64_t c, int64_t h, int64_t w) { return ((n * cv.h + h) * cv.w + w) * cv.c + c; };
  auto W = [&](int64_t k, int64_t c, int64_t r, int64_t s) { return ((k * cv.r + r) * cv.s + s) * cv.c + c; };
  auto Y = [&](int64_t n, int64_t k, int64_t p, int64_t q) { return ((n * P + p) * Q + q) * cv.k + k; };
  std::vector<double> out(o == Op::fprop ? cv.n * cv.k * P * Q : o == Op::dgrad ? cv.n * cv.c * cv.h * cv.w
                                                                                : cv.k * cv.c * cv.r * cv.s, 0.0);
  for (int64_t n = 0; n < cv.n; ++n)
    for (int64_t k = 0; k < cv.k; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q)
          for (int64_t r = 0; r < cv.r; ++r)
            for (int64_t s = 0; s < cv.s; ++s) {
              const int64_t h = p * cv.stride - cv.pad + r, w = q * cv.stride - cv.pad + s;
              if (h < 0 || h >= cv.h || w < 0 || w >= cv.w) continue;
              for (int64_t c = 0; c < cv.c; ++c) {
                if (o == Op::fprop) out[Y(n, k, p, q)] += double(xs[X(n, c, h, w)]) * ws[W(k, c, r, s)];
                else if (o == Op::dgrad) out[X(n, c, h, w)] += double(ys[Y(n, k, p, q)]) * ws[W(k, c, r, s)];
                else out[W(k, c, r, s)] += double(ys[Y(n, k, p, q)]) * xs[X(n, c, h, w)];
              }
            }
  return out;
}

struct Buffers {
  void *x = nullptr, *w = nullptr, *y = nullptr, *scale = nullptr, *ws = nullptr;
  ~Buffers() {
    for (void* p : {x, w, y, scale, ws}) if (p) cudaFree(p);
  }
};

// Runs plan p of the graph for op o / form f on the device buffers; returns false when cuDNN refuses to execute.
// The plan's workspace into b.ws (replacing an earlier one).
void prepare(const Plan& p, Buffers& b) {
  if (b.ws) {
    CU(cudaFree(b.ws));
    b.ws = nullptr;
  }
  if (p.workspace > 0) CU(cudaMalloc(&b.ws, static_cast<size_t>(p.workspace)));
}

bool execute(cudnnHandle_t handle, Plan& p, Form f, Buffers& b, cudnnStatus_t& st) {
  std::vector<int64_t> uids{1, 2, 3};
  std::vector<void*> ptrs{b.x, b.w, b.y};
  if (f == Form::scaled_bf16_out) {
    uids.push_back(5);
    ptrs.push_back(b.scale);
  }
  Owned vp{CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR};
  CK(set(vp.d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<int64_t>(uids.size())));
  CK(set(vp.d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(),
         static_cast<int64_t>(ptrs.size())));
  CK(set(vp.d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &b.ws));
  CK(cudnnBackendFinalize(vp.d));
  st = cudnnBackendExecute(handle, p.plan.d, vp.d);
  return st == CUDNN_STATUS_SUCCESS;
}

double time_ms(cudnnHandle_t handle, Plan& p, Form f, Buffers& b) {
  cudnnStatus_t st;
  for (int i = 0; i < 3; ++i) execute(handle, p, f, b, st);
  CU(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  const int reps = 20;
  CU(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i) execute(handle, p, f, b, st);
  CU(cudaEventRecord(e1));
  CU(cudaEventSynchronize(e1));
  float ms = 0;
  CU(cudaEventElapsedTime(&ms, e0, e1));
  return ms / reps;
}

// Engines timed per graph on the large shape (runtime-fusion engines compile a kernel when their plan is built).
constexpr int kTimedEngines = 6;

int64_t numel(Op result, const Conv& cv) {
  return result == Op::fprop ? cv.n * cv.k * cv.p() * cv.q() : result == Op::dgrad ? cv.n * cv.c * cv.h * cv.w
                                                                                    : cv.k * cv.c * cv.r * cv.s;
}

// Allocates x, w, y for conv cv with inputs of `in_bytes` per element (random levels in -7..7 when `levels`) and the
// op's result of `out_bytes`; returns the host levels through xs, ws, ys.
void fill(Op o, const Conv& cv, size_t in_bytes, bool fp8, size_t out_bytes, Buffers& b, std::vector<int>& xs,
          std::vector<int>& ws, std::vector<int>& ys) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> lv(-7, 7);
  const int64_t nx = cv.n * cv.c * cv.h * cv.w, nw = cv.k * cv.c * cv.r * cv.s, ny = cv.n * cv.k * cv.p() * cv.q();
  auto upload = [&](void*& dst, int64_t n, bool is_result, std::vector<int>& host) {
    const size_t bytes = static_cast<size_t>(n) * (is_result ? out_bytes : in_bytes);
    CU(cudaMalloc(&dst, bytes));
    if (is_result) return;
    host.resize(static_cast<size_t>(n));
    std::vector<uint8_t> raw(bytes);
    for (int64_t i = 0; i < n; ++i) {
      host[i] = lv(rng);
      if (fp8) raw[i] = e4m3_of_int(host[i]);
      else reinterpret_cast<uint16_t*>(raw.data())[i] = float_to_bf16(static_cast<float>(host[i]));
    }
    CU(cudaMemcpy(dst, raw.data(), bytes, cudaMemcpyHostToDevice));
  };
  upload(b.x, nx, o == Op::dgrad, xs);
  upload(b.w, nw, o == Op::wgrad, ws);
  upload(b.y, ny, o == Op::fprop, ys);
  const float one = 1.0f;
  CU(cudaMalloc(&b.scale, 4));
  CU(cudaMemcpy(b.scale, &one, 4, cudaMemcpyHostToDevice));
}

// Max |result - reference| of the op's result on the device (f32 or bf16).
double max_error(Op o, const Conv& cv, const Buffers& b, bool f32_out, const std::vector<double>& ref) {
  const int64_t n = numel(o, cv);
  const void* src = o == Op::fprop ? b.y : o == Op::dgrad ? b.x : b.w;
  double err = 0;
  if (f32_out) {
    std::vector<float> h(static_cast<size_t>(n));
    CU(cudaMemcpy(h.data(), src, h.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) err = std::max(err, std::fabs(static_cast<double>(h[i]) - ref[i]));
  } else {  // bf16 rounds: compare against the reference rounded to bf16
    std::vector<uint16_t> h(static_cast<size_t>(n));
    CU(cudaMemcpy(h.data(), src, h.size() * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i)
      err = std::max(err, static_cast<double>(std::fabs(bf16_to_float(h[i]) -
                                                            bf16_to_float(float_to_bf16(static_cast<float>(ref[i]))))));
  }
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 128;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CU(cudaGetDeviceProperties(&prop, 0));
  cudnnHandle_t handle;
  CK(cudnnCreate(&handle));
  std::printf("cuDNN %zu (headers %d.%d.%d), %s (sm_%d%d)\n", cudnnGetVersion(), CUDNN_MAJOR, CUDNN_MINOR,
              CUDNN_PATCHLEVEL, prop.name, prop.major, prop.minor);
  // A small shape checked against the host, and a ResNet-50 stage-1 3x3 convolution timed.
  const Conv small{2, 32, 8, 8, 32, 3, 3, 1, 1};
  const Conv big{batch, 64, 56, 56, 64, 3, 3, 1, 1};
  for (Op o : {Op::fprop, Op::dgrad, Op::wgrad}) {
    for (Form f : {Form::f32_out, Form::bf16_out, Form::scaled_bf16_out}) {
      cudnnStatus_t gs;
      Graph g(o, f, small, CUDNN_DATA_FP8_E4M3, handle, gs);
      std::printf("%s e4m3, %-38s: ", op_name(o), form_name(f));
      if (gs != CUDNN_STATUS_SUCCESS) {
        std::printf("graph refused (%s)\n", cudnnGetErrorString(gs));
        continue;
      }
      int64_t count = 0, got = 0;
      CK(cudnnBackendGetAttribute(g.graph.d, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &got,
                                  &count));
      std::vector<int64_t> usable;
      for (int64_t i = 0; i < count; ++i) {
        Plan p(g, i, handle);
        if (p.ok()) usable.push_back(i);
      }
      std::printf("%zu of %lld engines give a plan", usable.size(), static_cast<long long>(count));
      if (usable.empty()) {
        std::printf("\n");
        continue;
      }
      Plan p(g, usable.front(), handle);
      Buffers b;
      std::vector<int> xs, ws, ys;
      fill(o, small, 1, true, f == Form::f32_out ? 4 : 2, b, xs, ws, ys);
      cudnnStatus_t es;
      prepare(p, b);
      if (!execute(handle, p, f, b, es)) {
        std::printf("; engine %lld refuses to run (%s)\n", static_cast<long long>(usable.front()), cudnnGetErrorString(es));
        continue;
      }
      CU(cudaDeviceSynchronize());
      const double err = max_error(o, small, b, f == Form::f32_out, reference(o, small, xs, ws, ys));
      std::printf("; engine %lld: max |error| %.3g against the host", static_cast<long long>(usable.front()), err);
      // Timed on the large shape, beside the same op in bf16 (heuristics' first usable engine each).
      Graph g8(o, f, big, CUDNN_DATA_FP8_E4M3, handle, gs);
      Graph g16(o, f, big, CUDNN_DATA_BFLOAT16, handle, gs);
      double best8 = -1, best16 = -1;
      for (auto [gr, bytes, best] : {std::tuple{&g8, size_t{1}, &best8}, std::tuple{&g16, size_t{2}, &best16}}) {
        int64_t c2 = 0;
        CK(cudnnBackendGetAttribute(gr->graph.d, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1,
                                    &got, &c2));
        Buffers bb;
        std::vector<int> a1, a2, a3;
        fill(o, big, bytes, bytes == 1, f == Form::f32_out ? 4 : 2, bb, a1, a2, a3);
        int timed = 0;
        for (int64_t i = 0; i < c2 && timed < kTimedEngines; ++i) {
          Plan pp(*gr, i, handle);
          if (!pp.ok()) continue;
          prepare(pp, bb);
          if (!execute(handle, pp, f, bb, es)) continue;
          ++timed;
          const double ms = time_ms(handle, pp, f, bb);
          if (*best < 0 || ms < *best) *best = ms;
        }
      }
      std::printf("; n=%lld 64x56x56 3x3: fastest engine e4m3 %.3f ms, bf16 %.3f ms\n", static_cast<long long>(batch),
                  best8, best16);
    }
  }
  cudnnDestroy(handle);
  return 0;
}
