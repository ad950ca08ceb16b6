// cuDNN for hadatrain: a per-thread handle per device bound to the current stream, HT_CUDNN_CHECK, RAII
// descriptors, and 2-D convolution (forward, backward data, backward filter) on raw device pointers for
// dense NCHW or NHWC (channels-last) tensors. CUDA builds only.
//
// Note [cuDNN math and algorithms]
// f32 runs with CUDNN_FMA_MATH (no TF32, so results stay within fp32 rounding of the CPU reference); f64 uses
// CUDNN_DEFAULT_MATH (compute type f64); bf16/f16 use CUDNN_TENSOR_OP_MATH with compute type f32 (tensor
// cores with fp32 accumulation: DEFAULT_MATH does not promise tensor cores for them).
// By default the cudnnGet*Algorithm_v7 heuristics choose (no benchmarking): the first candidate whose workspace
// query and execution do not report NOT_SUPPORTED is used and cached. With HADATRAIN_CUDNN_FIND=1 in the
// environment algorithms are measured instead (measured slower end to end: ResNet-18 bf16 NHWC training step
// 8.30 ms with Find against 6.72 ms with the heuristics, H200): the first call
// of a (pass, dtype, layout, device, shapes, params) runs
// cudnnFind*AlgorithmEx (every algorithm timed on the call's own buffers, with a workspace of up to 1 GiB from
// the caching allocator, less when it cannot give that much) and keeps the fastest that succeeded, under
// the math rule above (f32 always runs with FMA math, so never TF32), with its workspace size and math type, for the
// life of the process. Outputs are computed again with the chosen algorithm afterwards, so the find pass
// never leaves a user-visible result. When Find fails the heuristics decide. The measured choice may be a
// non-deterministic algorithm (atomics in backward filter), as with torch.backends.cudnn.benchmark.
// Workspaces come from the caching allocator (a u8 tensor on the device, freed in stream order).
#pragma once
#ifdef HADATRAIN_CUDA
#include <cudnn.h>

#include <cstdint>

#include "hadatrain/cuda/check.h"
#include "hadatrain/tensor/dtype_enum.h"

namespace ht::cuda {

[[noreturn]] void throw_cudnn_error(const char* file, int line, const char* expr, cudnnStatus_t status);

// cuDNN handle of this thread for the current device, created on first use, with its stream set to the
// current stream (Note [Current stream] in context.h) on every call.
cudnnHandle_t cudnn_handle();

// cuDNN's data type for a hadatrain dtype (f32, f64, bf16, f16); throws ht::Error naming `op` otherwise.
cudnnDataType_t cudnn_dtype(DType dt, const char* op);

// Memory layout of a convolution's activations: nchw, or nhwc (channels last: x (N, H, W, C), y (N, OH, OW, O),
// filter (O, KH, KW, C/groups), cuDNN's KRSC).
enum class TensorFormat { nchw, nhwc };

// ---- RAII descriptors ------------------------------------------------------------------------------------
class TensorDesc {
 public:
  TensorDesc();
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  // A dense NCHW tensor (n, c, h, w).
  void set_nchw(cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w);
  // A dense tensor of logical sizes (n, c, h, w) stored as `f` says (nhwc: memory order n, h, w, c).
  void set_4d(cudnnDataType_t dt, TensorFormat f, int64_t n, int64_t c, int64_t h, int64_t w);
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc();
  ~FilterDesc();
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  // A dense (o, c_per_group, kh, kw) filter (nchw), or (o, kh, kw, c_per_group) in memory (nhwc, KRSC).
  void set(cudnnDataType_t dt, int64_t o, int64_t c, int64_t kh, int64_t kw, TensorFormat f = TensorFormat::nchw);
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc();
  ~ConvDesc();
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

// ---- convolution -----------------------------------------------------------------------------------------
struct ConvProblem {
  DType dtype = DType::f32;             // of x, weight, y and their gradients (f32, f64, bf16, f16)
  int64_t N = 0, C = 0, H = 0, W = 0;   // x (N, C, H, W)
  int64_t O = 0, KH = 0, KW = 0;        // weight (O, C/groups, KH, KW)
  int64_t OH = 0, OW = 0;               // y (N, O, OH, OW)
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1, groups = 1;
  TensorFormat format = TensorFormat::nchw;  // nhwc: x, y and the filter are channels last (see TensorFormat)
};

// All pointers are dense device buffers of problem.dtype on the current device, laid out as problem.format
// says; work is queued on the current stream. Outputs are overwritten (beta = 0), except that backward data with
// `accumulate` adds its result into dx (beta = 1: dx = result + dx, rounded once). Each returns true when it
// ran; false only for an nhwc problem that no cuDNN algorithm supports, or for an accumulating backward data whose
// algorithm does not take beta = 1 (nothing was written in either case; the caller permutes to NCHW, or computes
// into a scratch buffer and adds, instead). An nchw problem that nothing supports throws.
[[nodiscard]] bool conv2d_forward(const ConvProblem& p, const void* x, const void* w, void* y);
[[nodiscard]] bool conv2d_backward_data(const ConvProblem& p, const void* dy, const void* w, void* dx,
                                        bool accumulate = false);
[[nodiscard]] bool conv2d_backward_filter(const ConvProblem& p, const void* x, const void* dy, void* dw);

// Whether the first call of each problem measures algorithms with cudnnFind*AlgorithmEx or takes the
// heuristics' choice (default): true only when the environment sets HADATRAIN_CUDNN_FIND=1 (read once).
bool cudnn_find_enabled();

}  // namespace ht::cuda

// HT_CUDNN_CHECK(cudnnConvolutionForward(...)): throws ht::CudaError naming the expression and status.
#define HT_CUDNN_CHECK(expr)                                                        \
  do {                                                                              \
    const cudnnStatus_t ht_cudnn_st_ = (expr);                                      \
    if (ht_cudnn_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                          \
      ::ht::cuda::throw_cudnn_error(__FILE__, __LINE__, #expr, ht_cudnn_st_);       \
  } while (0)

#endif  // HADATRAIN_CUDA
