// Copy kernels: same-dtype strided copies move bits (one kernel per element size, and a shared-memory
// tiled kernel per element size for transposes); converting copies
// load the source as double and store the destination from double with the runtime dtypes switched in
// the kernel (one kernel for all 110 dtype pairs) plus typed flat kernels for the hot f32 <-> bf16/f16
// pairs.
//
// Note [Conversion through double]
// The CPU reference converts From -> To as: to bool: (double)x != 0; to a float type: To(double x) when
// either side is f64, To(float(double x)) from integers, To(float x) otherwise; to an integer: trunc of
// (double)x, saturated, NaN -> 0. Every source value is exactly representable as a double (but i64
// beyond 2^53, which the CPU also rounds through double), float(double(x)) == float(x) for float-like x,
// and the narrow-float constructors from double first round to float. So "load as double, then
// convert<To>(double)" reproduces each rule bit for bit.
#include "cuda/kernels/copy.cuh"
#include "cuda/kernels/map.cuh"

namespace ht::kernels {
namespace {

HT_DEV double load_as_double(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::f32: return to_double(static_cast<const float*>(p)[i]);
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::bf16: return to_double(static_cast<const bf16*>(p)[i]);
    case DType::f16: return to_double(static_cast<const f16*>(p)[i]);
    case DType::f8e4m3: return to_double(static_cast<const f8e4m3*>(p)[i]);
    case DType::f8e5m2: return to_double(static_cast<const f8e5m2*>(p)[i]);
    case DType::i8: return static_cast<const int8_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::b8: return static_cast<const uint8_t*>(p)[i] != 0 ? 1.0 : 0.0;
    default: return 0.0;
  }
}

HT_DEV void store_from_double(DType dt, void* p, int64_t i, double v) {
  switch (dt) {
    case DType::f32: static_cast<float*>(p)[i] = convert<float>(v); break;
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::bf16: static_cast<bf16*>(p)[i] = convert<bf16>(v); break;
    case DType::f16: static_cast<f16*>(p)[i] = convert<f16>(v); break;
    case DType::f8e4m3: static_cast<f8e4m3*>(p)[i] = convert<f8e4m3>(v); break;
    case DType::f8e5m2: static_cast<f8e5m2*>(p)[i] = convert<f8e5m2>(v); break;
    case DType::i8: static_cast<int8_t*>(p)[i] = convert<int8_t>(v); break;
    case DType::u8: static_cast<uint8_t*>(p)[i] = convert<uint8_t>(v); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = convert<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(p)[i] = convert<int64_t>(v); break;
    case DType::b8: static_cast<bool*>(p)[i] = v != 0.0; break;
    default: break;
  }
}

__global__ void convert_kernel(DType dst_dt, DType src_dt, void* dst, const void* src, Layout<2> l) {
  for (int64_t i = global_thread(); i < l.numel; i += grid_threads()) {
    int64_t off[2];
    offsets_of(l, i, off);
    store_from_double(dst_dt, dst, off[0], load_as_double(src_dt, src, off[1]));
  }
}

template <class U>  // unsigned integer of the element size
__global__ void copy_bits_kernel(U* dst, const U* src, Layout<2> l) {
  for (int64_t i = global_thread(); i < l.numel; i += grid_threads()) {
    int64_t off[2];
    offsets_of(l, i, off);
    dst[off[0]] = src[off[1]];
  }
}

template <class U>
__global__ void fill_kernel(U* dst, U value, Layout<1> l) {
  for (int64_t i = global_thread(); i < l.numel; i += grid_threads()) {
    int64_t off[1];
    offsets_of(l, i, off);
    dst[off[0]] = value;
  }
}

template <class D>
struct ConvertF {  // typed conversion for the flat fast path (float -> narrow or narrow -> float)
  template <class S>
  HT_DEV D operator()(S x) const { return convert<D>(x); }
};

// Flat, aligned f32 <-> bf16/f16, f32/bf16 -> fp8 and i8/e4m3 -> bf16/f16/f32 conversions; false when not
// applicable.
bool launch_fast_convert(const CopyArgs& c, cudaStream_t stream) {
  if (!c.layout.flat()) return false;
  const Layout<2>& l = c.layout;
  auto run = [&](auto dst_tag, auto src_tag) {
    using D = decltype(dst_tag);
    using S = decltype(src_tag);
    launch_map1(static_cast<D*>(c.dst), static_cast<const S*>(c.src), l, ConvertF<D>{}, stream, "convert_flat");
    return true;
  };
  if (c.src_dtype == DType::f32 && c.dst_dtype == DType::bf16) return run(bf16{}, float{});
  if (c.src_dtype == DType::f32 && c.dst_dtype == DType::f16) return run(f16{}, float{});
  if (c.src_dtype == DType::bf16 && c.dst_dtype == DType::f32) return run(float{}, bf16{});
  if (c.src_dtype == DType::f16 && c.dst_dtype == DType::f32) return run(float{}, f16{});
  // into fp8 (hardware cvt on sm_89+, see float_to_fp8): 16-byte loads, 4- or 8-byte stores; flat kernel
  // only (unaligned pointers take the generic kernel)
  auto run_flat = [&](auto dst_tag, auto src_tag) {
    using D = decltype(dst_tag);
    using S = decltype(src_tag);
    if (!aligned_to(c.src, 16) || !aligned_to(c.dst, sizeof(D) * kVec<S>)) return false;
    launch_map1_flat(static_cast<D*>(c.dst), static_cast<const S*>(c.src), l.numel, ConvertF<D>{}, stream,
                     "convert_fp8_flat");
    return true;
  };
  if (c.src_dtype == DType::f32 && c.dst_dtype == DType::f8e4m3) return run_flat(f8e4m3{}, float{});
  if (c.src_dtype == DType::f32 && c.dst_dtype == DType::f8e5m2) return run_flat(f8e5m2{}, float{});
  if (c.src_dtype == DType::bf16 && c.dst_dtype == DType::f8e4m3) return run_flat(f8e4m3{}, bf16{});
  if (c.src_dtype == DType::bf16 && c.dst_dtype == DType::f8e5m2) return run_flat(f8e5m2{}, bf16{});
  // From the quantisers' 1-byte codes (int8 levels, e4m3 codes) into floats: exact, 16 codes a load. The generic
  // kernel's decode through double takes 0.83 ms for LUQ's (50432, 3072) e4m3 g_y codes into bf16.
  auto from_codes = [&](auto src_tag) {
    switch (c.dst_dtype) {
      case DType::bf16: return run_flat(bf16{}, src_tag);
      case DType::f16: return run_flat(f16{}, src_tag);
      case DType::f32: return run_flat(float{}, src_tag);
      default: return false;
    }
  };
  if (c.src_dtype == DType::i8) return from_codes(int8_t{});
  if (c.src_dtype == DType::f8e4m3) return from_codes(f8e4m3{});
  return false;
}

// ---- tiled transpose ----
// A same-dtype copy whose source is contiguous along one dim r and whose destination is contiguous along
// another dim c (a transpose or a permute made contiguous) reads and writes through a 64 x 64 tile in
// shared memory, so both the loads and the stores of a warp are coalesced. Index space (b, r, c):
// dst offset b * dst_bs + r * dst_rs + c, src offset b * src_bs + r + c * src_cs.
struct TransposeShape {
  int64_t batch, rows, cols;
  int64_t dst_bs, dst_rs, src_bs, src_cs;
};

constexpr int kTile = 64;

template <class U>
__global__ void __launch_bounds__(256) transpose_kernel(U* dst, const U* src, TransposeShape t) {
  __shared__ U tile[kTile][kTile + 1];  // tile[c][r]; the +1 column keeps the column reads conflict-free
  const int64_t tiles_r = (t.rows + kTile - 1) / kTile, tiles_c = (t.cols + kTile - 1) / kTile;
  const int64_t per_batch = tiles_r * tiles_c, total = per_batch * t.batch;
  const int tx = threadIdx.x, ty = threadIdx.y;  // 32 x 8
  for (int64_t tile_id = blockIdx.x; tile_id < total; tile_id += gridDim.x) {
    const int64_t b = tile_id / per_batch, rest = tile_id - b * per_batch;
    const int64_t r0 = (rest / tiles_c) * kTile, c0 = (rest % tiles_c) * kTile;
    const U* s = src + b * t.src_bs;
    U* d = dst + b * t.dst_bs;
#pragma unroll
    for (int i = 0; i < kTile / 8; ++i) {
      const int cc = ty + 8 * i;
      const int64_t c = c0 + cc;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = tx + 32 * h;
        const int64_t r = r0 + rr;
        if (r < t.rows && c < t.cols) tile[cc][rr] = s[r + c * t.src_cs];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile / 8; ++i) {
      const int rr = ty + 8 * i;
      const int64_t r = r0 + rr;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int cc = tx + 32 * h;
        const int64_t c = c0 + cc;
        if (r < t.rows && c < t.cols) d[r * t.dst_rs + c] = tile[cc][rr];
      }
    }
    __syncthreads();
  }
}

// The tiled shape of a same-dtype copy when it is a (batched) transpose; false otherwise.
bool transpose_shape(const Layout<2>& l, TransposeShape& t) {
  const int n = l.ndim;
  if (n != 2 && n != 3) return false;
  if (l.stride[0][n - 1] != 1 || l.stride[1][n - 2] != 1) return false;
  t.batch = n == 3 ? l.size[0] : 1;
  t.rows = l.size[n - 2];
  t.cols = l.size[n - 1];
  t.dst_bs = n == 3 ? l.stride[0][0] : 0;
  t.src_bs = n == 3 ? l.stride[1][0] : 0;
  t.dst_rs = l.stride[0][n - 2];
  t.src_cs = l.stride[1][n - 1];
  return t.rows > 1 && t.cols > 1;
}

template <class U>
void transpose_bits(const CopyArgs& c, const TransposeShape& t, cudaStream_t stream) {
  const int64_t tiles = ((t.rows + kTile - 1) / kTile) * ((t.cols + kTile - 1) / kTile) * t.batch;
  constexpr int64_t kMaxBlocks = 132 * 16;
  const unsigned grid = static_cast<unsigned>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
  transpose_kernel<U><<<grid, dim3(32, 8), 0, stream>>>(static_cast<U*>(c.dst), static_cast<const U*>(c.src), t);
  HT_CHECK_LAUNCH("transpose_kernel");
}

// ---- vector runs ----
// A same-dtype copy whose innermost dim is contiguous in both operands (a permute that keeps the last dim, a cat
// or pad into a view, narrow(...).contiguous()) moves `V`-byte vectors instead of elements: the same Layout in
// units of V bytes (the inner size and every stride divided by V / item, both pointers V-aligned), so each thread
// computes one offset per vector rather than per element. LBP-WHT's (B, 14, 14, C) -> (64, B·P·C) patch copies
// took the element-wise kernel. Returns false when no V in {16, 8, 4} > item fits.
template <class V>
bool copy_vector_runs(const CopyArgs& c, std::size_t item, cudaStream_t stream) {
  const Layout<2>& l = c.layout;
  const int n = l.ndim;
  if (sizeof(V) <= item || n == 0 || l.stride[0][n - 1] != 1 || l.stride[1][n - 1] != 1) return false;
  const auto per = static_cast<int64_t>(sizeof(V) / item);  // elements per vector
  if (l.size[n - 1] % per != 0 || reinterpret_cast<uintptr_t>(c.dst) % sizeof(V) != 0 ||
      reinterpret_cast<uintptr_t>(c.src) % sizeof(V) != 0)
    return false;
  for (int k = 0; k < 2; ++k)
    for (int d = 0; d < n - 1; ++d)
      if (l.stride[k][d] % per != 0) return false;
  int64_t shape[kMaxDims], dst_strides[kMaxDims], src_strides[kMaxDims];
  for (int d = 0; d < n; ++d) {
    shape[d] = d == n - 1 ? l.size[d] / per : l.size[d];
    dst_strides[d] = d == n - 1 ? 1 : l.stride[0][d] / per;
    src_strides[d] = d == n - 1 ? 1 : l.stride[1][d] / per;
  }
  const int64_t* const strides[2] = {dst_strides, src_strides};
  const Layout<2> v = make_layout<2>(n, shape, strides);
  copy_bits_kernel<V><<<cuda::grid_for(v.numel), cuda::kBlock, 0, stream>>>(static_cast<V*>(c.dst),
                                                                            static_cast<const V*>(c.src), v);
  HT_CHECK_LAUNCH("copy_bits_kernel (vector runs)");
  return true;
}

template <class U>
void copy_bits(const CopyArgs& c, cudaStream_t stream) {
  if (copy_vector_runs<uint4>(c, sizeof(U), stream) || copy_vector_runs<uint2>(c, sizeof(U), stream) ||
      copy_vector_runs<uint32_t>(c, sizeof(U), stream))
    return;
  TransposeShape t;
  if (transpose_shape(c.layout, t)) return transpose_bits<U>(c, t, stream);
  copy_bits_kernel<U><<<cuda::grid_for(c.layout.numel), cuda::kBlock, 0, stream>>>(
      static_cast<U*>(c.dst), static_cast<const U*>(c.src), c.layout);
  HT_CHECK_LAUNCH("copy_bits_kernel");
}

template <class U>
void fill_as(uint64_t bits, void* dst, const Layout<1>& l, cudaStream_t stream) {
  fill_kernel<U><<<cuda::grid_for(l.numel), cuda::kBlock, 0, stream>>>(static_cast<U*>(dst), static_cast<U>(bits), l);
  HT_CHECK_LAUNCH("fill_kernel");
}

std::size_t item_bytes(DType dt) {
  switch (dt) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::i4x2: return 0;  // not element-addressable
    default: return 1;
  }
}

}  // namespace

void launch_copy(const CopyArgs& c, cudaStream_t stream) {
  if (c.layout.numel == 0) return;
  if (c.dst_dtype == DType::i4x2 || c.src_dtype == DType::i4x2) HT_UNSUPPORTED_DTYPE("launch_copy", DType::i4x2);
  if (c.dst_dtype == c.src_dtype) {
    if (c.layout.flat()) {
      HT_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, static_cast<std::size_t>(c.layout.numel) * item_bytes(c.dst_dtype),
                                    cudaMemcpyDeviceToDevice, stream));
      return;
    }
    switch (item_bytes(c.dst_dtype)) {
      case 1: return copy_bits<uint8_t>(c, stream);
      case 2: return copy_bits<uint16_t>(c, stream);
      case 4: return copy_bits<uint32_t>(c, stream);
      default: return copy_bits<uint64_t>(c, stream);
    }
  }
  if (launch_fast_convert(c, stream)) return;
  convert_kernel<<<cuda::grid_for(c.layout.numel), cuda::kBlock, 0, stream>>>(c.dst_dtype, c.src_dtype, c.dst, c.src,
                                                                               c.layout);
  HT_CHECK_LAUNCH("convert_kernel");
}

void launch_fill(std::size_t itemsize, uint64_t bits, void* dst, const Layout<1>& l, cudaStream_t stream) {
  if (l.numel == 0) return;
  switch (itemsize) {
    case 1: return fill_as<uint8_t>(bits, dst, l, stream);
    case 2: return fill_as<uint16_t>(bits, dst, l, stream);
    case 4: return fill_as<uint32_t>(bits, dst, l, stream);
    case 8: return fill_as<uint64_t>(bits, dst, l, stream);
    default: HT_UNSUPPORTED_DTYPE("launch_fill", -1);
  }
}

}  // namespace ht::kernels
