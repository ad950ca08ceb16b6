// HLA projection kernel (see hla.h). The slab of one (sample, block p, channel tile) lives in shared memory as
// f32 rows of `stride` = tile + 1 floats (the pad keeps the column reads of the channels layout free of bank
// conflicts); every butterfly stage is one pass of all threads over the n/2 × tile pairs, separated by
// __syncthreads. Adds and subtracts use __fadd_rn / __fsub_rn, so the bits equal the CPU reference's.
#include "kernels/convert.cuh"
#include "kernels/hla.h"
#include "kernels/launch.h"

namespace ht::kernels {
namespace {

constexpr int kHlaThreads = 256;
constexpr int64_t kHlaSlabFloats = 16384;  // n · tile target: 64 KiB of f32

struct HlaGeometry {
  int64_t tile;     // channels per CTA
  int64_t tiles;    // ceil(C / tile)
  int64_t stride;   // floats per slab row in shared memory
  size_t smem;      // bytes: slab + kept indices
};

HlaGeometry hla_geometry(const HlaProjectArgs& a) {
  HlaGeometry g;
  int64_t tile = kHlaSlabFloats / a.block;
  tile = tile < 1 ? 1 : (tile > 32 ? 32 : tile);
  if (tile > a.C) tile = a.C;
  g.tile = tile;
  g.tiles = (a.C + tile - 1) / tile;
  g.stride = tile > 1 ? tile + 1 : 1;
  g.smem = static_cast<size_t>(a.block * g.stride) * sizeof(float) + static_cast<size_t>(a.kept) * sizeof(int16_t);
  return g;
}

template <class T>
__global__ void __launch_bounds__(kHlaThreads)
    hla_project_kernel(HlaProjectArgs a, HlaGeometry g, const __grid_constant__ HlaRows rows) {
  extern __shared__ float slab[];  // (n, stride)
  int16_t* kept = reinterpret_cast<int16_t*>(slab + a.block * g.stride);
  const int64_t n = a.block, r = a.kept, tile = g.tile, stride = g.stride;
  const int64_t P = a.L / n, R = P * r;
  const int64_t cta = blockIdx.x;
  const int64_t ti = cta % g.tiles, p = (cta / g.tiles) % P, b = cta / (g.tiles * P);
  const int64_t c0 = ti * tile;
  const int64_t width = (a.C - c0) < tile ? (a.C - c0) : tile;  // channels of this tile
  const T* x = static_cast<const T*>(a.x) + b * a.sb + p * n * a.sl + c0 * a.sc;

  for (int64_t k = threadIdx.x; k < r; k += blockDim.x) kept[k] = rows.idx[k];
  for (int64_t e = threadIdx.x; e < n * tile; e += blockDim.x) {
    const int64_t t = e / tile, c = e % tile;
    slab[t * stride + c] = c < width ? convert<float>(x[t * a.sl + c * a.sc]) : 0.0f;
  }
  __syncthreads();
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t q = threadIdx.x; q < (n / 2) * tile; q += blockDim.x) {
      const int64_t c = q % tile, k = q / tile;
      const int64_t j = (k / h) * 2 * h + k % h;
      float* u = slab + j * stride + c;
      float* v = slab + (j + h) * stride + c;
      const float s = *u, d = *v;
      *u = __fadd_rn(s, d);
      *v = __fsub_rn(s, d);
    }
    __syncthreads();
  }
  if (!a.channels) {  // out (B, R, C): rows of `width` contiguous floats
    float* o = a.out + (b * R + p * r) * a.C + c0;
    for (int64_t e = threadIdx.x; e < r * width; e += blockDim.x) {
      const int64_t i = e / width, c = e % width;
      o[i * a.C + c] = slab[kept[i] * stride + c];
    }
  } else {  // out (B, C, R): runs of r contiguous floats per channel
    float* o = a.out + (b * a.C + c0) * R + p * r;
    for (int64_t e = threadIdx.x; e < r * width; e += blockDim.x) {
      const int64_t c = e / r, i = e % r;
      o[c * R + i] = slab[kept[i] * stride + c];
    }
  }
}

}  // namespace

void launch_hla_project(const HlaProjectArgs& a, const HlaRows& rows, cudaStream_t stream) {
  if (a.B == 0 || a.L == 0 || a.C == 0) return;
  const HlaGeometry g = hla_geometry(a);
  const int64_t ctas = a.B * (a.L / a.block) * g.tiles;
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = hla_project_kernel<T>;
    if (g.smem > 48 * 1024)
      HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(g.smem)));
    kernel<<<static_cast<unsigned>(ctas), kHlaThreads, g.smem, stream>>>(a, g, rows);
    HT_CHECK_LAUNCH("hla_project");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("hla_project", a.dtype);
}

}  // namespace ht::kernels
