// HALO's transposes of codes (1 byte) and bf16 / f16 values (2 bytes), launch_halo_transpose, pure data movement
// bit for bit; and the unrotated quantiser that writes its codes in both layouts, launch_halo_quantize_transposed
// (cuda/kernels/halo.cuh).
//
// Note [HALO transposes]
// Three kernels, the first whose conditions hold:
//  - the wide kernel: R and C multiples of 16 / sizeof(E) and 16-byte aligned pointers (every code and activation
//    tensor of a LLaMA layer). A CTA of 256 threads moves a tile of 128 bytes × 128 / sizeof(E) rows: each
//    thread loads 16-byte vectors along rows of x (all of its loads issued before the first shared-memory store),
//    the tile sits in shared memory as 4-byte words (rows padded to 33 words: the stores of a warp fall in 32
//    distinct banks), and each thread reads the 16 / sizeof(E) words of one word column and one 16-byte segment
//    of the output rows, transposes them in registers (__byte_perm: 4×4 bytes, or 2×2 halves) and stores one
//    16-byte vector per output row it covers: 8 threads write 128 contiguous bytes of an output row;
//  - the word kernel (R and C multiples of 4 / sizeof(E), 4-byte aligned pointers);
//  - the element kernel (anything else).
#include <cstdint>

#include "cuda/kernels/halo.cuh"
#include "cuda/kernels/halo_common.cuh"
#include "cuda/kernels/kernel_launch.cuh"

namespace ht::kernels {
namespace {

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The write phase of the wide kernel (Note [HALO transposes]): the tile of EB-byte elements, rows r0 ... and columns
// c0 ... of an (R, C) matrix held as 4-byte words in rows of kTilePitch words, leaves as rows of out (C, R): each
// thread takes one word column w and one 16-byte segment seg of the output rows it covers. After a barrier.
constexpr int kTilePitch = 33;  // words per tile row: 32 and one of padding (the stores of a warp: 32 banks)
template <int EB>
__device__ __forceinline__ void write_tile_transposed(const uint32_t* tile, int64_t R, int64_t C, int64_t r0,
                                                      int64_t c0, uint8_t* out) {
  constexpr int kPer16 = 16 / EB;
  constexpr int kPitch = kTilePitch;
  const int t = threadIdx.x;
  const int seg = t % 8, w = t / 8;  // input rows seg·kPer16 ... + kPer16 − 1; tile word column w
  const int64_t gr = r0 + seg * kPer16;
  if (gr >= R) return;
  uint32_t word[kPer16];
#pragma unroll
  for (int e = 0; e < kPer16; ++e) word[e] = tile[(seg * kPer16 + e) * kPitch + w];
  constexpr int kRowsPerWord = 4 / EB;  // output rows (input columns) one word column holds
#pragma unroll
  for (int j = 0; j < kRowsPerWord; ++j) {
    const int64_t oc = c0 + w * kRowsPerWord + j;  // output row
    if (oc >= C) break;
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (EB == 1) {
        // bytes j of words 4k ... 4k + 3 (input rows in order), a 4×4 byte transpose
        const uint32_t lo = __byte_perm(word[4 * k], word[4 * k + 1], j < 2 ? 0x5140 : 0x7362);
        const uint32_t hi = __byte_perm(word[4 * k + 2], word[4 * k + 3], j < 2 ? 0x5140 : 0x7362);
        o[k] = __byte_perm(lo, hi, j % 2 == 0 ? 0x5410 : 0x7632);
      } else {
        // halves j of words 2k and 2k + 1
        o[k] = __byte_perm(word[2 * k], word[2 * k + 1], j == 0 ? 0x5410 : 0x7632);
      }
    }
    *reinterpret_cast<uint4*>(out + (oc * R + gr) * EB) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// The wide kernel of Note [HALO transposes] for elements of EB bytes (1 or 2): x (R, C) -> out (C, R).
template <int EB>
__global__ void __launch_bounds__(256) transpose_wide_kernel(const uint8_t* x, int64_t R, int64_t C, uint8_t* out) {
  constexpr int kTile = 128 / EB;       // rows and columns of the tile (128 bytes of a row either way)
  constexpr int kPer16 = 16 / EB;       // elements in 16 bytes: columns per load, rows per output segment
  constexpr int kLoads = kTile / 32;    // 16-byte loads per thread (8 per tile row, 256 threads)
  constexpr int kPitch = kTilePitch;
  __shared__ uint32_t tile[kTile * kPitch];
  const int t = threadIdx.x;
  // the last row band first (Note [HALO row order] in halo_fast.cu)
  const int64_t r0 = (gridDim.y - 1 - blockIdx.y) * int64_t{kTile}, c0 = blockIdx.x * int64_t{kTile};
  {
    const int c16 = t % 8;
    const int64_t gc = c0 + c16 * kPer16;
    uint4 v[kLoads];
#pragma unroll
    for (int q = 0; q < kLoads; ++q) {
      const int64_t gr = r0 + t / 8 + 32 * q;
      v[q] = gr < R && gc < C ? *reinterpret_cast<const uint4*>(x + (gr * C + gc) * EB) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int q = 0; q < kLoads; ++q) {
      uint32_t* row = tile + (t / 8 + 32 * q) * kPitch + 4 * c16;
      row[0] = v[q].x, row[1] = v[q].y, row[2] = v[q].z, row[3] = v[q].w;
    }
  }
  __syncthreads();
  write_tile_transposed<EB>(tile, R, C, r0, c0, out);
}

// Note [HALO transposed codes]: the quantise pass of the unrotated quantiser writing the codes in both layouts,
// (R, C) and (C, R), from one read of x: a CTA takes a tile of 128 rows × 128 columns, each thread quantises the
// 16-byte vectors it loads (all loads issued first) and stores their codes in place (8 or 4 bytes; 16 threads write
// a row's 128 codes), and the tile's codes leave transposed through write_tile_transposed. The codes are
// halo_detail::code_of's, four at a time (codes4, Note [HALO codes by four]); the absmax pass before it is the
// unrotated one of halo.cu.
template <DType DT>
__global__ void __launch_bounds__(256) quantize_transposed_kernel(const void* x, int64_t R, int64_t C, uint8_t* codes,
                                                                  uint8_t* codes_t, bool int8, const float* absmax,
                                                                  float* scale) {
  using halo_detail::Vec16;
  constexpr int V = Vec16<DT>::V;              // elements per 16-byte load: 4 (f32) or 8
  constexpr int kLoadsPerRow = 128 / V;        // a tile row is 128 elements
  constexpr int kRowsPerPass = 256 / kLoadsPerRow;
  constexpr int kPasses = 128 / kRowsPerPass;  // 16-byte loads per thread
  __shared__ uint32_t tile[128 * kTilePitch];
  const float m = *absmax, r = halo_detail::reciprocal_step(m, int8);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale = halo_detail::scale_of(m, int8);
  const int t = threadIdx.x, cl = t % kLoadsPerRow;
  const int64_t r0 = blockIdx.y * int64_t{128}, c0 = blockIdx.x * int64_t{128}, gc = c0 + cl * V;
  float v[kPasses][V];
#pragma unroll
  for (int q = 0; q < kPasses; ++q) {
    const int64_t gr = r0 + t / kLoadsPerRow + kRowsPerPass * q;
    if (gr < R && gc < C) {
      Vec16<DT>::load(x, gr * C + gc, v[q]);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) v[q][e] = 0.0f;
    }
  }
#pragma unroll
  for (int q = 0; q < kPasses; ++q) {
    const int rr = t / kLoadsPerRow + kRowsPerPass * q;
    const int64_t gr = r0 + rr;
    uint32_t w[V / 4];
#pragma unroll
    for (int j = 0; j < V / 4; ++j) w[j] = halo_detail::codes4(v[q] + 4 * j, m, r, int8);
    if (gr < R && gc < C) {
      if constexpr (V == 8) *reinterpret_cast<uint2*>(codes + gr * C + gc) = make_uint2(w[0], w[1]);
      else *reinterpret_cast<uint32_t*>(codes + gr * C + gc) = w[0];
    }
#pragma unroll
    for (int j = 0; j < V / 4; ++j) tile[rr * kTilePitch + cl * (V / 4) + j] = w[j];
  }
  __syncthreads();
  write_tile_transposed<1>(tile, R, C, r0, c0, codes_t);
}

// The word kernel (Note [HALO transposes]): 64×64 tiles through shared memory in 4-byte words: a thread reads a
// word of EPW = 4 / sizeof(E) elements along a row of x and writes a word of EPW elements along a row of out (a
// column of x). Needs R and C multiples of EPW and 4-byte aligned pointers (every word then lies wholly inside or
// outside the matrix). The tile's rows are padded to 65 elements so that the column reads of the write phase fall
// in distinct banks.
template <class E>
__global__ void __launch_bounds__(256) transpose_words_kernel(const E* x, int64_t R, int64_t C, E* out) {
  constexpr int EPW = 4 / sizeof(E), WPR = 64 / EPW;  // elements per word, words per 64-element row
  __shared__ E tile[64][65];
  const int64_t c0 = blockIdx.x * int64_t{64}, r0 = blockIdx.y * int64_t{64};
  for (int it = threadIdx.x; it < 64 * WPR; it += blockDim.x) {
    const int r = it / WPR, c = (it % WPR) * EPW;
    if (r0 + r < R && c0 + c < C) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(x + (r0 + r) * C + c0 + c);
#pragma unroll
      for (int e = 0; e < EPW; ++e) tile[r][c + e] = static_cast<E>(w >> (8 * sizeof(E) * e));
    }
  }
  __syncthreads();
  for (int it = threadIdx.x; it < 64 * WPR; it += blockDim.x) {
    const int c = it / WPR, r = (it % WPR) * EPW;
    if (c0 + c < C && r0 + r < R) {
      uint32_t w = 0;
#pragma unroll
      for (int e = 0; e < EPW; ++e) w |= uint32_t{tile[r + e][c]} << (8 * sizeof(E) * e);
      *reinterpret_cast<uint32_t*>(out + (c0 + c) * R + r0 + r) = w;
    }
  }
}

template <class E>
__global__ void transpose_kernel(const E* x, int64_t R, int64_t C, E* out) {
  __shared__ E tile[32][33];
  const int64_t c0 = blockIdx.x * int64_t{32}, r0 = blockIdx.y * int64_t{32};
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < R && c < C) tile[i][threadIdx.x] = x[r * C + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < R && c < C) out[c * R + r] = tile[threadIdx.x][i];
  }
}

}  // namespace

void launch_halo_transpose(const void* x, int64_t R, int64_t C, int elem_bytes, void* out, cudaStream_t stream) {
  const int64_t per16 = elem_bytes == 1 ? 16 : 8;  // elements per 16 bytes
  if ((elem_bytes == 1 || elem_bytes == 2) && R % per16 == 0 && C % per16 == 0 && aligned(x, 16) && aligned(out, 16)) {
    const int64_t tile = 128 / elem_bytes;
    const dim3 tiles(static_cast<unsigned>((C + tile - 1) / tile), static_cast<unsigned>((R + tile - 1) / tile));
    if (elem_bytes == 1)
      transpose_wide_kernel<1><<<tiles, 256, 0, stream>>>(static_cast<const uint8_t*>(x), R, C,
                                                           static_cast<uint8_t*>(out));
    else
      transpose_wide_kernel<2><<<tiles, 256, 0, stream>>>(static_cast<const uint8_t*>(x), R, C,
                                                           static_cast<uint8_t*>(out));
    HT_CHECK_LAUNCH("halo_transpose_wide");
    return;
  }
  const int epw = elem_bytes == 1 ? 4 : 2;
  if ((elem_bytes == 1 || elem_bytes == 2) && R % epw == 0 && C % epw == 0 && aligned(x, 4) && aligned(out, 4)) {
    const dim3 tiles(static_cast<unsigned>((C + 63) / 64), static_cast<unsigned>((R + 63) / 64));
    if (elem_bytes == 1)
      transpose_words_kernel<<<tiles, 256, 0, stream>>>(static_cast<const uint8_t*>(x), R, C, static_cast<uint8_t*>(out));
    else
      transpose_words_kernel<<<tiles, 256, 0, stream>>>(static_cast<const uint16_t*>(x), R, C,
                                                          static_cast<uint16_t*>(out));
    HT_CHECK_LAUNCH("halo_transpose_words");
    return;
  }
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>((R + 31) / 32)), block(32, 8);
  if (elem_bytes == 1)
    transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const uint8_t*>(x), R, C, static_cast<uint8_t*>(out));
  else if (elem_bytes == 2)
    transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const uint16_t*>(x), R, C, static_cast<uint16_t*>(out));
  else
    HT_UNSUPPORTED_DTYPE("halo_transpose element bytes", elem_bytes);
  HT_CHECK_LAUNCH("halo_transpose");
}


void launch_halo_quantize_transposed(const HaloRowsArgs& a, void* codes, void* codes_t, DType code_dtype,
                                     float* absmax, float* scale, cudaStream_t stream) {
  const bool int8 = code_dtype == DType::i8;
  if (!int8 && code_dtype != DType::f8e4m3) HT_UNSUPPORTED_DTYPE("halo_quantize_transposed", code_dtype);
  HaloRowsArgs plain = a;
  plain.n = 0;
  plain.k = 1;
  const HaloSigns none{};
  launch_halo_absmax(plain, none, absmax, stream);
  const bool dtype_ok = a.in_dtype == DType::f32 || a.in_dtype == DType::bf16 || a.in_dtype == DType::f16;
  if (dtype_ok && a.R % 16 == 0 && a.C % 16 == 0 && aligned(a.x, 16) && aligned(codes, 16) && aligned(codes_t, 16)) {
    const dim3 tiles(static_cast<unsigned>((a.C + 127) / 128), static_cast<unsigned>((a.R + 127) / 128));
    auto* c = static_cast<uint8_t*>(codes);
    auto* ct = static_cast<uint8_t*>(codes_t);
    if (a.in_dtype == DType::f32)
      quantize_transposed_kernel<DType::f32><<<tiles, 256, 0, stream>>>(a.x, a.R, a.C, c, ct, int8, absmax, scale);
    else if (a.in_dtype == DType::bf16)
      quantize_transposed_kernel<DType::bf16><<<tiles, 256, 0, stream>>>(a.x, a.R, a.C, c, ct, int8, absmax, scale);
    else
      quantize_transposed_kernel<DType::f16><<<tiles, 256, 0, stream>>>(a.x, a.R, a.C, c, ct, int8, absmax, scale);
    HT_CHECK_LAUNCH("halo_quantize_transposed");
    return;
  }
  launch_halo_quantize_given(plain, none, codes, code_dtype, absmax, scale, stream);
  launch_halo_transpose(codes, a.R, a.C, 1, codes_t, stream);
}

}  // namespace ht::kernels
