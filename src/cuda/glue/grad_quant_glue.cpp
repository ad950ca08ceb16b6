// Tensor-level glue of the quantisation kernels (cuda/glue/grad_quant_glue.h, cuda/kernels/grad_quant.cuh). Inputs
// become dense f32 / bf16 / f16 (other floating dtypes are converted to f32 first, which is step 1 of
// Note [Bit-identical quantisation]); Hadamard blocks larger than 16, or blocks that would straddle a scale
// group (sample granularity of a 1-D tensor), are rotated by a separate pass into an f32 buffer that is then
// quantised with T = 1. Scales go to device memory; nothing here synchronises with the host. CUDA builds only.
#ifdef HADATRAIN_CUDA
#include "cuda/glue/grad_quant_glue.h"

#include "grad/quant_groups.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
#include "cuda/kernels/grad_quant.cuh"
#include "cuda/kernels/lowp_gemm.cuh"

namespace ht::cuda_ops {
namespace {

struct OnDevice {
  explicit OnDevice(const Tensor& t) : guard(t.device().index), stream(cuda::current_stream(t.device().index)) {}
  cuda::DeviceGuard guard;
  cudaStream_t stream;
};

// x dense in a dtype the kernels take.
Tensor kernel_input(const Tensor& x) {
  const DType dt = x.dtype();
  if (dt == DType::f32 || dt == DType::bf16 || dt == DType::f16) return x.contiguous();
  return to_dtype(x, DType::f32).contiguous();
}

// Runs one quantisation launch: args has everything but the input, workspace and the Hadamard block. sums: when
// not null, receives the column sums of x (QuantSpec::report_column_sums): from the quantiser's own pass where the
// strip kernel serves the launch (f32), else from the sum op.
void run_quant(kernels::GradQuantArgs args, const Tensor& x, int64_t block, const OnDevice& on, Tensor* sums) {
  // x = Wᵀ, the transposed view of a dense (R, C) W (HLQ's W operand of g_x): read W itself where the kernels can
  // (Note [Quantiser of a transposed input]), without a transposed copy.
  if (sums == nullptr && block == 16 && x.dim() == 2 && x.stride(0) == 1 && x.stride(1) == x.size(0)) {
    kernels::GradQuantArgs t = args;
    t.dtype = x.dtype();
    t.x = x.data_ptr();
    t.hadamard = 16;
    const int64_t R = x.size(1), C = x.size(0);
    if (kernels::grad_quant_of_transpose_applies(t, R, C)) {
      const Tensor ws = empty({static_cast<int64_t>(kernels::grad_quant_of_transpose_workspace_bytes(R, C))},
                              {DType::u8, x.device()});
      t.workspace = ws.data_ptr();
      kernels::launch_grad_quant_of_transpose(t, R, C, on.stream);
      return;
    }
  }
  Tensor in = kernel_input(x);
  float* column_sums = nullptr;  // the launch sums the columns in its pass
  if (sums != nullptr) {
    args.dtype = in.dtype();
    args.x = in.data_ptr();
    if (block == 1 && kernels::grad_quant_sums_in_pass(args)) {
      *sums = empty({args.cols}, {DType::f32, in.device()});
      column_sums = static_cast<float*>(sums->data_ptr());
    } else {
      *sums = grad::detail::column_sums_by_op(x);
    }
  }
  if (block > 16 || args.group_len % block != 0) {
    if (args.input_absmax) {  // max |x| of the unrotated input, before the kernels see the rotated copy
      kernels::launch_absmax(in.dtype(), args.input_absmax, in.data_ptr(), in.numel(), on.stream);
      args.input_absmax = nullptr;
    }
    Tensor rotated = empty(in.shape(), {DType::f32, in.device()});
    kernels::launch_hadamard_blocks(in.dtype(), static_cast<float*>(rotated.data_ptr()), in.data_ptr(), in.numel(),
                                    block, on.stream);
    in = rotated;
    block = 1;
  }
  args.dtype = in.dtype();
  args.x = in.data_ptr();
  args.hadamard = static_cast<int>(block);
  const std::size_t bytes = kernels::grad_quant_workspace_bytes(args, column_sums != nullptr);
  // Stream-ordered allocation: freed after the launch in stream order (Note [Stream-ordered frees]).
  const Tensor ws = bytes > 0 ? empty({static_cast<int64_t>(bytes)}, {DType::u8, in.device()}) : Tensor();
  args.workspace = ws.defined() ? ws.data_ptr() : nullptr;
  kernels::launch_grad_quant(args, on.stream, column_sums);
}

}  // namespace

namespace {

// The launch both quantisers share: groups, noise and output pointers; `kind`, `qmax`, `sawb` and
// `stochastic` differ. Empty inputs or groups only zero the scales.
// sums: as for run_quant.
void quantise(const grad::Quantized& q, const Tensor& x, grad::Granularity granularity, const grad::Noise& noise,
              kernels::GradQuantArgs args, int64_t hadamard_block, Tensor* sums = nullptr) {
  const grad::detail::Groups groups = grad::detail::groups_of(x, granularity);
  if (x.numel() == 0 || groups.len == 0) {
    if (q.scale.numel() > 0) fill_(q.scale, 0.0);
    if (sums != nullptr) *sums = zeros({x.size(x.dim() - 1)}, {DType::f32, x.device()});
    return;
  }
  OnDevice on(x);
  args.numel = x.numel();
  args.group_len = groups.len;
  args.seed = noise.seed;
  args.stream = noise.stream;
  args.stream_add = noise.step_word;
  args.values = static_cast<uint8_t*>(q.values.data_ptr());
  args.scale = static_cast<float*>(q.scale.data_ptr());
  args.input_absmax = q.input_absmax.defined() ? static_cast<float*>(q.input_absmax.data_ptr()) : nullptr;
  run_quant(args, x, hadamard_block, on, sums);
}

}  // namespace

void grad_quantize(grad::Quantized& q, const Tensor& x, const grad::QuantSpec& spec) {
  Tensor* sums = spec.report_column_sums ? &q.column_sums : nullptr;
  kernels::GradQuantArgs args;
  args.kind = kernels::QuantKind::uniform;
  args.qmax = grad::qmax_of(spec.bits);
  args.sawb = spec.scale_rule == grad::ScaleRule::sawb;
  args.stochastic = spec.rounding == grad::Rounding::stochastic;
  args.fp8_values = spec.values_dtype == DType::f8e4m3;  // quantize() checked bits <= 5
  // quantize() checked: dequantised values only in the natural layout.
  switch (spec.values_dtype) {
    case DType::f32: args.store = kernels::QuantStore::f32; break;
    case DType::bf16: args.store = kernels::QuantStore::bf16; break;
    case DType::f16: args.store = kernels::QuantStore::f16; break;
    default: args.store = kernels::QuantStore::codes;
  }
  // quantize() checked: one f32 element on x's device, tensor granularity, absmax rule.
  args.known_m = spec.known_absmax.defined() ? static_cast<const float*>(spec.known_absmax.data_ptr()) : nullptr;
  if (spec.layout == grad::ValuesLayout::transposed) {  // q.values (C, N); tensor granularity, T = 1 (checked)
    const int64_t cols = x.size(x.dim() - 1), rows = cols == 0 ? 0 : x.numel() / cols;
    if (cols % 8 != 0) {  // the tiled kernel needs runs of 8 columns: quantise, then transpose
      const grad::Quantized tmp{empty(x.shape(), {q.values.dtype(), x.device()}), q.scale, q.input_absmax, Tensor()};
      quantise(tmp, x, spec.granularity, spec.noise, args, 1, sums);
      if (rows > 0) copy_(q.values, reshape(tmp.values, {rows, cols}).transpose(0, 1));
      return;
    }
    args.transposed = true;
    args.cols = cols;
  }
  quantise(q, x, spec.granularity, spec.noise, args, spec.hadamard_block, sums);
}

void grad_luq(const grad::Quantized& q, const Tensor& x, const grad::LuqSpec& spec) {
  kernels::GradQuantArgs args;
  args.kind = kernels::QuantKind::luq;
  args.qmax = (1 << (spec.bits - 1)) - 1;
  args.sawb = false;
  args.stochastic = true;
  quantise(q, x, spec.granularity, spec.noise, args, 1);
}

void grad_hadamard(const Tensor& out, const Tensor& x, int64_t block) {
  if (x.numel() == 0) return;
  OnDevice on(out);
  const Tensor in = kernel_input(x);
  kernels::launch_hadamard_blocks(in.dtype(), static_cast<float*>(out.data_ptr()), in.data_ptr(), in.numel(), block,
                                  on.stream);
}

void grad_pack_int4(const Tensor& out, const Tensor& values) {
  OnDevice on(out);
  kernels::launch_pack_int4(static_cast<uint8_t*>(out.data_ptr()), static_cast<const int8_t*>(values.data_ptr()),
                            values.numel(), on.stream);
}

void grad_unpack_int4(const Tensor& out, const Tensor& packed) {
  OnDevice on(out);
  kernels::launch_unpack_int4(static_cast<int8_t*>(out.data_ptr()), static_cast<const uint8_t*>(packed.data_ptr()),
                              packed.numel(), on.stream);
}

void grad_scale_i32(const Tensor& out, const Tensor& acc, const Tensor& scale_a, const Tensor& scale_b, double mult,
                    const Tensor& row_scale, int64_t rows_per_scale) {
  OnDevice on(out);
  kernels::ScaleI32Args a;
  a.row_scale = row_scale.defined() ? static_cast<const float*>(row_scale.data_ptr()) : nullptr;
  a.cols = acc.dim() > 0 ? acc.size(acc.dim() - 1) : 1;
  a.rows_per_scale = rows_per_scale;
  a.acc = static_cast<const int32_t*>(acc.data_ptr());
  a.n = acc.numel();
  a.scale_a = static_cast<const float*>(scale_a.data_ptr());
  a.scale_b = static_cast<const float*>(scale_b.data_ptr());
  a.mult = static_cast<float>(mult);
  a.out_dtype = out.dtype();
  a.out = out.data_ptr();
  kernels::launch_scale_i32(a, on.stream);
}

void grad_split_scaled(const Tensor& out, const Tensor& codes, const Tensor& scale) {
  OnDevice on(out);
  kernels::SplitScaledArgs a;
  a.codes = codes.data_ptr();
  a.codes_dtype = codes.dtype();
  a.scale = static_cast<const float*>(scale.data_ptr());
  a.rows = codes.dim() > 0 ? codes.size(0) : 1;
  a.cols = a.rows > 0 ? codes.numel() / a.rows : 0;
  a.out = out.data_ptr();
  kernels::launch_split_scaled(a, on.stream);
}

}  // namespace ht::cuda_ops
#endif
