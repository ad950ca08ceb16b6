// unfold (token-major im2col) kernels and launch_unfold2d (see unfold.cuh): the gather kernel (one CTA per
// column row), the staged kernel (Note [Unfold, staged kernel]) and the vec kernel (Note [Unfold, vec kernel]),
// picked by shape and alignment in launch_unfold2d. Formulas read side by side with src/ops/unfold.cpp. The fold kernels (Notes [Fold, tiles kernel], [Fold, tiles2]) are
// in unfold_fold.cu; unfold_common.cuh holds what the two share.
#include <algorithm>
#include <cstdint>

#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "cuda/kernels/unfold.cuh"
#include "cuda/kernels/unfold_common.cuh"

namespace ht::kernels {
namespace {
using namespace uf;

// One CTA per column row (n, l): the threads walk its C·kh·kw entries (coalesced writes), 32-bit index math
// inside a row.
template <class T>
__global__ void unfold_kernel(const T* __restrict__ x, UnfoldStrides4 xs, UnfoldGeometry g, T* __restrict__ cols) {
  const int K = static_cast<int>(g.C * g.kh * g.kw), khw = static_cast<int>(g.kh * g.kw), kw = static_cast<int>(g.kw);
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W), OW = static_cast<int>(g.OW);
  const int dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int64_t L = g.OH * g.OW, rows = g.N * L;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t n = row / L;
    const int l = static_cast<int>(row - n * L);
    const int oh = l / OW, ow = l - oh * OW;
    const int h0 = oh * static_cast<int>(g.sh) - static_cast<int>(g.ph);
    const int w0 = ow * static_cast<int>(g.sw) - static_cast<int>(g.pw);
    const T* xn = x + n * xs.n;
    T* dst = cols + row * K;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
      const int c = k / khw, rem = k - c * khw, i = rem / kw, j = rem - i * kw;
      const int ih = h0 + i * dh, iw = w0 + j * dw;
      const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
      dst[k] = inside ? xn[c * xs.c + ih * xs.h + iw * xs.w] : convert<T>(0.0f);
    }
  }
}

// Note [Unfold, staged kernel]
// Variant 2 of unfold2d (cuda/kernels/unfold.cuh). Variant 1 gives a CTA one column row and decomposes every entry k
// into (c, i, j) with integer divisions, gathering from the image with strided reads. Here a block owns (n, oh,
// a group of cb channels, a tile of tw output columns ow0..ow0+tw) and
// 1. writes a table offs[k] = (c·PH + i·dh)·PW + j·dw of its cb·kh·kw entries (PH = (kh-1)·dh + 1 image rows,
//    PW = (tw-1)·sw + (kw-1)·dw + 1 image columns: the patch its positions read);
// 2. stages the patch (cb x PH x PW, zeros outside the image: the padding) in shared memory, walking the image
//    along its contiguous dimension (w when the w stride is the smaller one, NCHW; c otherwise, channels-last
//    views) so the reads are coalesced;
// 3. writes its tw positions' entries (tw·cb·kh·kw, one contiguous run when cb = C) as
//    cols[p][k] = patch[p·sw + offs[k]], (p, k) stepped without divisions.
// Every image element is read once per block that covers it (kh / sh rows of blocks; L2 serves the repeats).
// A copy: bit-identical to the gather kernel.
struct UnfoldTile {
  int cb = 1, tw = 1;  // channels and output columns per block
  int prow = 1, pcol = 1;  // patch rows (PH) and allocated patch columns (PW of a full tile)
  int offs_bytes = 0;      // the offset table's bytes, rounded up to 16
  int cchunks = 1, wtiles = 1;
};

// The tile a block of the staged and vec unfold kernels owns, from blockIdx.x = ((n · OH + oh) · cchunks + cc) ·
// wtiles + wt: channels [c0, c0 + cb), output columns [ow0, ow0 + tw) of output row oh of image n, and the
// patch it stages (rows from h0, pw_used of its PW columns from w0; Note [Unfold, staged kernel]).
struct UnfoldBlock {
  int C, H, W, OH, OW, kw, sw, dh, dw, khw;
  int64_t n;
  int oh, c0, cb, ow0, tw, PH, PW, pw_used, h0, w0, cbk;
};
__device__ __forceinline__ UnfoldBlock unfold_block(const UnfoldGeometry& g, const UnfoldTile& t) {
  UnfoldBlock u;
  u.C = static_cast<int>(g.C);
  u.H = static_cast<int>(g.H);
  u.W = static_cast<int>(g.W);
  u.OH = static_cast<int>(g.OH);
  u.OW = static_cast<int>(g.OW);
  const int kh = static_cast<int>(g.kh);
  u.kw = static_cast<int>(g.kw);
  u.sw = static_cast<int>(g.sw);
  u.dh = static_cast<int>(g.dh);
  u.dw = static_cast<int>(g.dw);
  u.khw = kh * u.kw;
  int64_t b = blockIdx.x;
  const int wt = static_cast<int>(b % t.wtiles);
  b /= t.wtiles;
  const int cc = static_cast<int>(b % t.cchunks);
  b /= t.cchunks;
  u.oh = static_cast<int>(b % u.OH);
  u.n = b / u.OH;
  u.c0 = cc * t.cb;
  u.cb = min(t.cb, u.C - u.c0);
  u.ow0 = wt * t.tw;
  u.tw = min(t.tw, u.OW - u.ow0);
  u.PH = t.prow;
  u.PW = t.pcol;
  u.pw_used = (u.tw - 1) * u.sw + (u.kw - 1) * u.dw + 1;
  u.h0 = u.oh * static_cast<int>(g.sh) - static_cast<int>(g.ph);
  u.w0 = u.ow0 * u.sw - static_cast<int>(g.pw);
  u.cbk = u.cb * u.khw;
  return u;
}

template <class T>
__global__ void __launch_bounds__(kFoldThreads)
    unfold_staged_kernel(const T* __restrict__ x, UnfoldStrides4 xs, UnfoldGeometry g, UnfoldTile t,
                         T* __restrict__ cols) {
  extern __shared__ __align__(16) unsigned char unfold_smem[];
  int* offs = reinterpret_cast<int*>(unfold_smem);
  T* patch = reinterpret_cast<T*>(unfold_smem + t.offs_bytes);
  const UnfoldBlock u = unfold_block(g, t);
  const int C = u.C, H = u.H, W = u.W, OH = u.OH, OW = u.OW, kw = u.kw, sw = u.sw, dh = u.dh, dw = u.dw;
  const int khw = u.khw;
  const int64_t n = u.n;
  const int oh = u.oh, c0 = u.c0, cb = u.cb, ow0 = u.ow0, tw = u.tw, PH = u.PH, PW = u.PW, pw_used = u.pw_used;
  const int h0 = u.h0, w0 = u.w0, cbk = u.cbk, tid = threadIdx.x;
  for (int k = tid; k < cbk; k += kFoldThreads) {
    const int c = k / khw, r = k - c * khw, i = r / kw, j = r - i * kw;
    offs[k] = (c * PH + i * dh) * PW + j * dw;
  }
  const T* xn = x + n * xs.n + int64_t(c0) * xs.c;
  const int staged = cb * PH * pw_used;
  const T zero = convert<T>(0.0f);
  if (xs.c < xs.w) {  // channels-last: c fastest
    for (int e = tid; e < staged; e += kFoldThreads) {
      const int c = e % cb, rq = e / cb, r = rq / pw_used, q = rq - r * pw_used;
      const int ih = h0 + r, iw = w0 + q;
      const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
      patch[(c * PH + r) * PW + q] = inside ? xn[c * xs.c + ih * xs.h + iw * xs.w] : zero;
    }
  } else {  // w fastest
    for (int e = tid; e < staged; e += kFoldThreads) {
      const int q = e % pw_used, cr = e / pw_used, r = cr % PH, c = cr / PH;
      const int ih = h0 + r, iw = w0 + q;
      const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
      patch[(c * PH + r) * PW + q] = inside ? xn[c * xs.c + ih * xs.h + iw * xs.w] : zero;
    }
  }
  __syncthreads();
  const int64_t K = int64_t(C) * khw;
  T* dst = cols + ((n * OH + oh) * OW + ow0) * K + int64_t(c0) * khw;
  const int total = tw * cbk;
  const int dp = kFoldThreads / cbk, dk = kFoldThreads - dp * cbk;
  int p = tid / cbk, k = tid - (tid / cbk) * cbk;
  for (int e = tid; e < total; e += kFoldThreads) {
    dst[p * K + k] = patch[p * sw + offs[k]];
    p += dp;
    k += dk;
    if (k >= cbk) {
      k -= cbk;
      ++p;
    }
  }
}

// The staged kernel's tile for g and elements of `elem` bytes, or false (the gather kernel runs then).
bool unfold_tile(const UnfoldGeometry& g, int64_t elem, UnfoldTile& t) {
  const int64_t khw = g.kh * g.kw, prow = (g.kh - 1) * g.dh + 1;
  auto pcol = [&](int64_t tw) { return (tw - 1) * g.sw + (g.kw - 1) * g.dw + 1; };
  auto table = [&](int64_t cb) { return (cb * khw * 4 + 15) / 16 * 16; };
  auto smem = [&](int64_t cb, int64_t tw) { return table(cb) + cb * prow * pcol(tw) * elem; };
  int64_t tw = std::min<int64_t>(g.OW, 32), cb = g.C;
  while (smem(cb, tw) > kFoldSmemMax && cb > 1) cb = (cb + 1) / 2;
  while (smem(cb, tw) > kFoldSmemMax && tw > 1) tw = (tw + 1) / 2;
  if (smem(cb, tw) > kFoldSmemMax) return false;
  const int64_t cchunks = (g.C + cb - 1) / cb, wtiles = (g.OW + tw - 1) / tw;
  if (g.N * g.OH * cchunks * wtiles > int64_t(0x7fffffff)) return false;
  t.cb = static_cast<int>(cb);
  t.tw = static_cast<int>(tw);
  t.prow = static_cast<int>(prow);
  t.pcol = static_cast<int>(pcol(tw));
  t.offs_bytes = static_cast<int>(table(cb));
  t.cchunks = static_cast<int>(cchunks);
  t.wtiles = static_cast<int>(wtiles);
  return true;
}

// Note [Unfold, vec kernel]
// The staged kernel's output phase (Note [Unfold, staged kernel]) writes one 2-byte element per thread per
// iteration, with a 4-byte offset-table load and a 2-byte patch load each: about 300 M store instructions for one
// C 64 32x32 3x3 bf16 layer at N 256, the likely bound (about 0.23 of the copy rate). This kernel keeps the staged kernel's tiles and patch layout and changes:
// 1. the offset table: 2-byte byte offsets offs[k] = ((c·PH + i·dh)·PW + j·dw)·sizeof(T) (a patch is at most
//    48 KB, so every byte offset fits 16 bits), so the kV = 16 / sizeof(T) offsets of one pack of consecutive
//    entries are ONE shared-memory load of 2·kV bytes (16 for 2-byte T, 8 for f32, 4 for f64);
// 2. the staging: the same walk along the image's contiguous dimension, its (c, row, column) indices stepped by
//    the block size without divisions (two per element before), the elements moved as raw bits; channels-last
//    images whose channels come in aligned 16-byte units (CL16: x, its n / h / w strides, C and the channel
//    group multiples of 16 bytes; C 64 bf16 NHWC) load 16 bytes of channels at a time and scatter them into
//    the patch's channel planes;
// 3. the output: a thread writes a pack of kV consecutive column entries (16 bytes) with one explicit
//    st.global.v4.u32 (as plane_store in batchnorm_common.cuh: NVVM may split a plain bf16 pack store into 2-byte
//    stores), gathering its kV entries from the patch at p·sw·sizeof(T) + offs[k..k+kV-1]; consecutive threads
//    write consecutive packs of a position's run (512 contiguous bytes a warp), (p, pack) stepped without
//    divisions. C 64 32x32 3x3 bf16: 9 packs a thread instead of 72 elements.
// A pack never straddles two positions' runs: the launcher takes this kernel only when K·sizeof(T) and the
// channel group's run cb·kh·kw·sizeof(T) are multiples of 16 bytes (unfold_vec_tile rounds a partial cb down to
// such a count) and the column pointer is 16-byte aligned; else the staged kernel runs in the same launcher. A
// copy of the same bits: bit-identical to the gather and staged kernels.
template <int Sz>
struct RawBits;
template <>
struct RawBits<2> {
  using type = uint16_t;
};
template <>
struct RawBits<4> {
  using type = uint32_t;
};
template <>
struct RawBits<8> {
  using type = unsigned long long;
};

// The element staging loops of the vec kernel (Note [Unfold, vec kernel] 2): visit(lo, mid, hi) for this
// thread's elements e = tid, tid + kFoldThreads, ... below `count`, e = (hi·M + mid)·L + lo (lo < L, mid < M),
// the digits stepped by kFoldThreads's own digits with carries instead of divided out of every e.
template <class F>
__device__ __forceinline__ void for_each_staged(int tid, int count, int L, int M, F&& visit) {
  const int dlo = kFoldThreads % L, dmid = (kFoldThreads / L) % M, dhi = kFoldThreads / L / M;
  int lo = tid % L, mid = (tid / L) % M, hi = tid / L / M;
  for (int e = tid; e < count; e += kFoldThreads) {
    visit(lo, mid, hi);
    lo += dlo;
    if (lo >= L) {
      lo -= L;
      ++mid;
    }
    mid += dmid;
    if (mid >= M) {
      mid -= M;
      ++hi;
    }
    hi += dhi;
  }
}

template <class T, bool CL16>
__global__ void __launch_bounds__(kFoldThreads)
    unfold_vec_kernel(const T* __restrict__ x, UnfoldStrides4 xs, UnfoldGeometry g, UnfoldTile t,
                      T* __restrict__ cols) {
  using R = typename RawBits<sizeof(T)>::type;
  constexpr int kSz = static_cast<int>(sizeof(T));
  constexpr int kV = 16 / kSz;      // entries of a pack
  constexpr int kOffWords = kV / 2;  // 4-byte words of a pack's offsets (2 bytes each)
  extern __shared__ __align__(16) unsigned char unfold_vec_smem[];
  uint16_t* offs = reinterpret_cast<uint16_t*>(unfold_vec_smem);
  unsigned char* patch = unfold_vec_smem + t.offs_bytes;
  R* patch_r = reinterpret_cast<R*>(patch);
  const UnfoldBlock u = unfold_block(g, t);
  const int C = u.C, H = u.H, W = u.W, OH = u.OH, OW = u.OW, kw = u.kw, sw = u.sw, dh = u.dh, dw = u.dw;
  const int khw = u.khw;
  const int64_t n = u.n;
  const int oh = u.oh, c0 = u.c0, cb = u.cb, ow0 = u.ow0, tw = u.tw, PH = u.PH, PW = u.PW, pw_used = u.pw_used;
  const int h0 = u.h0, w0 = u.w0, cbk = u.cbk, tid = threadIdx.x;
  for (int k = tid; k < cbk; k += kFoldThreads) {
    const int c = k / khw, r = k - c * khw, i = r / kw, j = r - i * kw;
    offs[k] = static_cast<uint16_t>(((c * PH + i * dh) * PW + j * dw) * kSz);
  }
  const R* xn = reinterpret_cast<const R*>(x) + n * xs.n + int64_t(c0) * xs.c;
  const int staged = cb * PH * pw_used;
  if constexpr (CL16) {  // channels-last, 16-byte units of kV channels: unit fastest, then q, then r
    const int cbv = cb / kV, plane = PH * PW;  // the launcher checked cb % kV == 0
    // (cv, q, r) stepped as for_each_staged steps its digits, written out here: through a lambda the compiler
    // orders this loop's registers differently for f32 and f64
    const int dc = kFoldThreads % cbv, dq = (kFoldThreads / cbv) % pw_used, dr = kFoldThreads / cbv / pw_used;
    int cv = tid % cbv, q = (tid / cbv) % pw_used, r = tid / cbv / pw_used;
    for (int e = tid; e < staged / kV; e += kFoldThreads) {
      const int ih = h0 + r, iw = w0 + q;
      uint4 u4 = make_uint4(0u, 0u, 0u, 0u);
      if (ih >= 0 && ih < H && iw >= 0 && iw < W)
        u4 = *reinterpret_cast<const uint4*>(xn + (cv * kV + ih * xs.h + iw * xs.w));
      const uint32_t w4[4] = {u4.x, u4.y, u4.z, u4.w};
      R* dp0 = patch_r + (cv * kV * PH + r) * PW + q;
#pragma unroll
      for (int u = 0; u < kV; ++u) {
        R v;
        if constexpr (kSz == 2) v = static_cast<R>(u % 2 == 0 ? w4[u / 2] & 0xffffu : w4[u / 2] >> 16);
        else if constexpr (kSz == 4) v = w4[u];
        else v = (static_cast<R>(w4[2 * u + 1]) << 32) | w4[2 * u];
        dp0[u * plane] = v;
      }
      cv += dc;
      if (cv >= cbv) {
        cv -= cbv;
        ++q;
      }
      q += dq;
      if (q >= pw_used) {
        q -= pw_used;
        ++r;
      }
      r += dr;
    }
  } else {
    // channel c, patch row r and column q of the patch, zeros outside the image (the padding)
    auto stage = [&](int c, int q, int r) {
      const int ih = h0 + r, iw = w0 + q;
      const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
      patch_r[(c * PH + r) * PW + q] = inside ? xn[c * xs.c + ih * xs.h + iw * xs.w] : R(0);
    };
    if (xs.c < xs.w)  // channels-last: c fastest, then the patch column q, then the row r
      for_each_staged(tid, staged, cb, pw_used, stage);
    else  // w fastest: the patch column q, then the row r, then c
      for_each_staged(tid, staged, pw_used, PH, [&](int q, int r, int c) { stage(c, q, r); });
  }
  __syncthreads();
  const int64_t K = int64_t(C) * khw;
  const int Kb = static_cast<int>(K * kSz);  // bytes between positions' runs (tw·Kb < 2^31: the host checked)
  unsigned char* dst = reinterpret_cast<unsigned char*>(cols + ((n * OH + oh) * OW + ow0) * K + int64_t(c0) * khw);
  const int npk = cbk / kV;  // packs per position (the launcher checked cbk·sizeof(T) % 16 == 0)
  const int total = tw * npk, pstep = sw * kSz;
  const int dp = kFoldThreads / npk, dk = kFoldThreads - dp * npk;
  int p = tid / npk, kp = tid - (tid / npk) * npk;
  for (int e = tid; e < total; e += kFoldThreads) {
    uint32_t ofw[kOffWords];  // the pack's kV offsets, two a word
    if constexpr (kOffWords == 4) {
      const uint4 o = reinterpret_cast<const uint4*>(offs)[kp];
      ofw[0] = o.x;
      ofw[1] = o.y;
      ofw[2] = o.z;
      ofw[3] = o.w;
    } else if constexpr (kOffWords == 2) {
      const uint2 o = reinterpret_cast<const uint2*>(offs)[kp];
      ofw[0] = o.x;
      ofw[1] = o.y;
    } else {
      ofw[0] = reinterpret_cast<const uint32_t*>(offs)[kp];
    }
    const unsigned char* src = patch + p * pstep;
    R v[kV];
#pragma unroll
    for (int u = 0; u < kV; ++u) {
      const uint32_t off = u % 2 == 0 ? ofw[u / 2] & 0xffffu : ofw[u / 2] >> 16;
      v[u] = *reinterpret_cast<const R*>(src + off);
    }
    uint32_t w4[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if constexpr (kSz == 2) w4[u] = uint32_t(v[2 * u]) | (uint32_t(v[2 * u + 1]) << 16);
      else if constexpr (kSz == 4) w4[u] = v[u];
      else w4[u] = u % 2 == 0 ? uint32_t(v[u / 2]) : uint32_t(v[u / 2] >> 32);
    }
    unsigned char* d = dst + (p * Kb + kp * 16);
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(d), "r"(w4[0]), "r"(w4[1]), "r"(w4[2]),
                 "r"(w4[3])
                 : "memory");
    p += dp;
    kp += dk;
    if (kp >= npk) {
      kp -= npk;
      ++p;
    }
  }
}

// The vec kernel's tile for g and elements of `elem` bytes (Note [Unfold, vec kernel]): the staged kernel's, with
// a partial channel group rounded down to a count whose run is a multiple of 16 bytes; false when the packs do not
// fit the runs (K·elem % 16 != 0, or no such count fits): the launcher runs the staged kernel then. The column pointer's
// alignment is the launcher's check.
bool unfold_vec_tile(const UnfoldGeometry& g, int64_t elem, UnfoldTile& t) {
  if (!unfold_tile(g, elem, t)) return false;
  const int64_t khw = g.kh * g.kw;
  if (g.C * khw * elem % 16 != 0) return false;
  int64_t unit = 1;  // the fewest channels whose run is a multiple of 16 bytes (<= 8)
  while (unit * khw * elem % 16 != 0) ++unit;
  int64_t cb = t.cb;
  if (cb < g.C) {
    if (cb < unit) return false;
    cb = cb / unit * unit;
  }
  const int64_t cchunks = (g.C + cb - 1) / cb;
  if (g.N * g.OH * cchunks * t.wtiles > int64_t(0x7fffffff)) return false;
  if (t.tw * g.C * khw * elem > int64_t(0x7fffffff)) return false;  // the kernel's 32-bit offsets in a block's rows
  // 2-byte byte offsets: the patch must stay below 64 KB (it is below 48 KB: unfold_tile's bound)
  if (cb * t.prow * t.pcol * elem >= 65536) return false;
  t.cb = static_cast<int>(cb);
  t.cchunks = static_cast<int>(cchunks);
  t.offs_bytes = static_cast<int>((cb * khw * 2 + 15) / 16 * 16);
  return true;
}

constinit LaunchCounter g_unfold_staged_launches, g_unfold_vec_launches;

}  // namespace

int64_t unfold_staged_launches() { return g_unfold_staged_launches.get(); }
int64_t unfold_vec_launches() { return g_unfold_vec_launches.get(); }

void launch_unfold2d(DType dt, const void* x, UnfoldStrides4 xs, const UnfoldGeometry& g, void* cols,
                     cudaStream_t stream) {
  const int64_t total = g.N * g.OH * g.OW * g.C * g.kh * g.kw;
  if (total == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    UnfoldTile t;
    // the vec kernel where its packs fit, else the staged kernel where its patch fits, else the gather kernel
    if (aligned_to(cols, 16) && unfold_vec_tile(g, int64_t(sizeof(T)), t)) {
      const size_t smem = size_t(t.offs_bytes) + size_t(t.cb) * t.prow * t.pcol * sizeof(T);
      const unsigned blocks = static_cast<unsigned>(g.N * g.OH * t.cchunks * t.wtiles);
      // channels-last images staged in 16-byte units of channels where every unit is aligned
      const int64_t sz = int64_t(sizeof(T));
      const bool cl16 = xs.c == 1 && g.C * sz % 16 == 0 && t.cb * sz % 16 == 0 && xs.n * sz % 16 == 0 &&
                        xs.h * sz % 16 == 0 && xs.w * sz % 16 == 0 && aligned_to(x, 16);
      const T* xt = static_cast<const T*>(x);
      T* ct = static_cast<T*>(cols);
      if (cl16) unfold_vec_kernel<T, true><<<blocks, kFoldThreads, smem, stream>>>(xt, xs, g, t, ct);
      else unfold_vec_kernel<T, false><<<blocks, kFoldThreads, smem, stream>>>(xt, xs, g, t, ct);
      HT_CHECK_LAUNCH("unfold2d (vec)");
      g_unfold_vec_launches.add();
      return;
    }
    if (unfold_tile(g, int64_t(sizeof(T)), t)) {
      const size_t smem = size_t(t.offs_bytes) + size_t(t.cb) * t.prow * t.pcol * sizeof(T);
      const unsigned blocks = static_cast<unsigned>(g.N * g.OH * t.cchunks * t.wtiles);
      unfold_staged_kernel<T><<<blocks, kFoldThreads, smem, stream>>>(static_cast<const T*>(x), xs, g, t,
                                                                      static_cast<T*>(cols));
      HT_CHECK_LAUNCH("unfold2d (staged)");
      g_unfold_staged_launches.add();
      return;
    }
    const int64_t rows = g.N * g.OH * g.OW;
    unfold_kernel<T><<<cuda::grid_for(rows * cuda::kBlock), cuda::kBlock, 0, stream>>>(static_cast<const T*>(x), xs, g,
                                                                        static_cast<T*>(cols));
    HT_CHECK_LAUNCH("unfold2d");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("unfold2d", dt);
}

}  // namespace ht::kernels
