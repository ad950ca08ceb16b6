// unfold / fold kernels (see unfold.h). Formulas read side by side with src/ops/unfold.cpp.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/convert.cuh"
#include "kernels/launch.h"
#include "kernels/variant.h"
#include "kernels/unfold.h"

namespace ht::kernels {
namespace {

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

// One thread per image element, gathering its column entries in ascending (i, j) order (the CPU's order).
template <class T>
__global__ void fold_kernel(const T* __restrict__ cols, FoldStrides3 cs, UnfoldGeometry g, T* __restrict__ x) {
  using A = acc_t<T>;
  const int W = static_cast<int>(g.W), OH = static_cast<int>(g.OH), OW = static_cast<int>(g.OW);
  const int kh = static_cast<int>(g.kh), kw = static_cast<int>(g.kw), sh = static_cast<int>(g.sh), sw = static_cast<int>(g.sw);
  const int ph = static_cast<int>(g.ph), pw = static_cast<int>(g.pw), dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int64_t HW = g.H * g.W, total = g.N * g.C * HW;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = e / HW, n = plane / g.C, c = plane - n * g.C;
    const int hw = static_cast<int>(e - plane * HW), h = hw / W, w = hw - h * W;
    const T* base = cols + n * cs.n;
    A acc = A(0);
    for (int i = 0; i < kh; ++i) {
      const int th = h + ph - i * dh;  // = oh·sh
      if (th < 0 || th % sh != 0 || th / sh >= OH) continue;
      const int oh = th / sh;
      for (int j = 0; j < kw; ++j) {
        const int tw = w + pw - j * dw;
        if (tw < 0 || tw % sw != 0 || tw / sw >= OW) continue;
        const int ow = tw / sw;
        acc = acc + convert<A>(base[(int64_t(oh) * OW + ow) * cs.l + ((c * kh + i) * kw + j) * cs.k]);
      }
    }
    x[e] = convert<T>(acc);
  }
}

// Note [Fold, staged kernel]
// Variant 2 of fold2d (kernels/unfold.h). Variant 1 (fold_kernel) gives a thread one image element and reads its
// kh·kw column entries directly: neighbouring threads (w, w+1) read addresses C·kh·kw elements apart, so every
// 2-byte read costs a 32-byte sector (~16x read amplification on (N, L, C·3·3) bf16 columns). Here a block owns
// (n, a group of cb channels, a tile of tw image columns w0..w0+tw) and walks the image rows h = 0..H-1 top to
// bottom; its thread t < cb·tw owns the element (c0 + t / tw, w0 + t % tw) of every row, so the stores of a row
// are tw-contiguous. Before row h the block stages the column rows oh that h needs and that are not staged yet
// (oh·sh = h + ph - i·dh for some i; at most rb = (kh-1)·dh / sh + 1 of them at a time) in a ring of rb
// shared-memory rows (slot oh % rb): for every output column ow the tile reaches (ow_lo..ow_hi, halo included)
// the cb·kh·kw entries of its channels, a contiguous run of the column row when the columns are contiguous,
// converted to the accumulation type (exact). Every column entry is read from global memory once per w tile
// (the tile halo, (kw-1)·dw / sw columns, is read by both neighbours). Each element then sums its entries from
// shared memory in ascending (i, j) order in fp32 (fp64 for f64) and rounds once: the same additions in the
// same order as fold_kernel and the CPU, so the bits are the same. A staged position has an odd stride (ckp
// words for 4-byte accumulators), so a warp over 32 consecutive w reads 32 banks. Stride 1 (both dims) has its
// own instantiation without divisions. Staging (fold_stage_rows) is one loop over (row, position, entry) with
// incremental indices (no division per element) and kFoldLoads loads in flight per thread; contiguous 2-byte
// columns whose runs start at even entries and have even length load entry pairs (4 bytes). Variant 3 stages
// one column row ahead of need (the ring gets a slot more): it stages every other image row, twice the rows at
// once, so twice the loads are in flight per barrier pair and there are half the barriers. Ring invariant: at
// row h the ring holds the rb latest staged rows (rb = rows a row needs + ahead); the rows h needs are the
// latest ones, since hi(h) - lo(h) + 1 <= rb - ahead and staged <= hi(h) + ahead.
constexpr int kFoldThreads = 256;
constexpr int kFoldLoads = 8;                // column loads a thread keeps in flight while staging
constexpr int64_t kFoldSmemMax = 48 * 1024;  // no opt-in; leaves room for several blocks per SM

struct FoldTile {
  int cb = 1, tw = 1;  // channels and image columns per block (cb·tw <= kFoldThreads)
  int rw = 1, rb = 1;  // staged positions per ring row (>= any tile's ow_hi - ow_lo + 1), ring slots
  int ckp = 1;         // shared-memory stride of one staged position, >= cb·kh·kw, odd
  int cchunks = 1, wtiles = 1;
  bool pairs = false;  // 2-byte T, entries contiguous (stride 1), even row / image strides, 4-byte aligned
  int ahead = 0;       // rows staged ahead of need (variant 3: 1; the ring has rb = rows needed + ahead slots)
};

// Stages column rows first..first+nrows-1 of the block (positions ow_lo.. of cn, rw per row, `ent` load units of
// U = T or a pair of T per position) into ring slots slot0, slot0+1, .. (mod slots) as A: one flattened loop over
// (row, position, unit), kFoldLoads loads in flight per thread, indices stepped without divisions.
template <class T, class A, int UNITS>
__device__ __forceinline__ void fold_stage_rows(const T* __restrict__ cn, FoldStrides3 cs, int OW, int first, int nrows,
                                                int rw, int ent, int slot0, int slots, int row_stride, int ckp,
                                                A* __restrict__ sm) {
  using U = std::conditional_t<UNITS == 2, Pack<T, 2>, T>;
  const int tid = threadIdx.x, per = nrows * rw * ent;
  const int dp = kFoldThreads / ent, dk = kFoldThreads - dp * ent;
  const int q0 = tid / ent, r0 = q0 / rw;
  int r = r0, pr = q0 - r0 * rw, k = tid - q0 * ent;  // row, position in the row, unit of the next store
  int s = (slot0 + r0) % slots;                       // its ring slot
  for (int e = tid; e < per; e += kFoldLoads * kFoldThreads) {
    U v[kFoldLoads];
    int lr = r, lp = pr, lk = k;
#pragma unroll
    for (int u = 0; u < kFoldLoads; ++u) {
      if (e + u * kFoldThreads < per)
        v[u] = *reinterpret_cast<const U*>(cn + (int64_t(first + lr) * OW + lp) * cs.l + int64_t(UNITS * lk) * cs.k);
      lp += dp;
      lk += dk;
      if (lk >= ent) {
        lk -= ent;
        ++lp;
      }
      while (lp >= rw) {
        lp -= rw;
        ++lr;
      }
    }
#pragma unroll
    for (int u = 0; u < kFoldLoads; ++u) {
      if (e + u * kFoldThreads < per) {
        A* d = sm + s * row_stride + pr * ckp + UNITS * k;
        if constexpr (UNITS == 2) {
          d[0] = convert<A>(v[u].v[0]);
          d[1] = convert<A>(v[u].v[1]);
        } else {
          d[0] = convert<A>(v[u]);
        }
      }
      pr += dp;
      k += dk;
      if (k >= ent) {
        k -= ent;
        ++pr;
      }
      while (pr >= rw) {
        pr -= rw;
        ++r;
        if (++s == slots) s = 0;
      }
    }
  }
}

template <class T, bool S1>
__global__ void __launch_bounds__(kFoldThreads, 4)
    fold_staged_kernel(const T* __restrict__ cols, FoldStrides3 cs, UnfoldGeometry g, FoldTile t, T* __restrict__ x) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char fold_smem[];
  A* sm = reinterpret_cast<A*>(fold_smem);
  const int C = static_cast<int>(g.C), H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int OH = static_cast<int>(g.OH), OW = static_cast<int>(g.OW);
  const int kh = static_cast<int>(g.kh), kw = static_cast<int>(g.kw), sh = static_cast<int>(g.sh), sw = static_cast<int>(g.sw);
  const int ph = static_cast<int>(g.ph), pw = static_cast<int>(g.pw), dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int khw = kh * kw;
  int64_t b = blockIdx.x;
  const int wt = static_cast<int>(b % t.wtiles);
  b /= t.wtiles;
  const int cc = static_cast<int>(b % t.cchunks);
  const int64_t n = b / t.cchunks;
  const int c0 = cc * t.cb, cb = min(t.cb, C - c0);
  const int w0 = wt * t.tw, tw = min(t.tw, W - w0);
  const int cbk = cb * khw;  // staged entries per position
  const int wl = w0 + pw - (kw - 1) * dw;
  const int ow_lo = wl <= 0 ? 0 : (wl + sw - 1) / sw;
  const int ow_hi = min((w0 + tw - 1 + pw) / sw, OW - 1);
  const int rw = ow_hi - ow_lo + 1;  // <= 0: no column reaches the tile (its elements are 0)
  const int tid = threadIdx.x;
  const bool active = tid < cb * tw;
  const int oc = active ? tid / tw : 0;
  const int w = w0 + (active ? tid - oc * tw : 0);
  T* xo = x + ((n * C + c0 + oc) * H) * int64_t(W) + w;
  const T* cn = cols + n * cs.n + int64_t(c0) * khw * cs.k + int64_t(ow_lo) * cs.l;
  // pairs of 2-byte entries loaded as one 4-byte word when every run starts at an even entry and is even long
  const bool pairs = t.pairs && cbk % 2 == 0 && (c0 * khw) % 2 == 0;
  const int row_stride = t.rw * t.ckp;
  int staged = -1;  // the highest column row staged (or skipped) so far
  for (int h = 0; h < H; ++h) {
    const int hl = h + ph - (kh - 1) * dh;
    const int lo = hl <= 0 ? 0 : (S1 ? hl : (hl + sh - 1) / sh);
    const int hi = min(S1 ? h + ph : (h + ph) / sh, OH - 1);
    const int first = max(staged + 1, lo);
    const int last = min(hi + t.ahead, OH - 1);  // variant 3 stages one row ahead
    if (first <= hi) {
      if (rw > 0) {
        __syncthreads();  // the previous rows' reads of the slots reused below are done
        const int nrows = last - first + 1, slot0 = first % t.rb;
        bool done = false;
        if constexpr (sizeof(T) == 2) {
          if (pairs) {  // pairs of 2-byte entries as one 4-byte load
            fold_stage_rows<T, A, 2>(cn, cs, OW, first, nrows, rw, cbk / 2, slot0, t.rb, row_stride, t.ckp, sm);
            done = true;
          }
        }
        if (!done) fold_stage_rows<T, A, 1>(cn, cs, OW, first, nrows, rw, cbk, slot0, t.rb, row_stride, t.ckp, sm);
        __syncthreads();
      }
      staged = last;
    }
    if (!active) continue;
    A acc = A(0);
    const int cbase = oc * khw - ow_lo * t.ckp;
    if constexpr (S1) {
      int slot = (h + ph) % t.rb;  // slot of oh = h + ph - i·dh, walked down (dh < rb when kh > 1)
      for (int i = 0; i < kh; ++i) {
        const int oh = h + ph - i * dh;
        if (oh >= 0 && oh < OH) {
          const int row = slot * row_stride + cbase + i * kw;  // + ow·ckp + j >= 0 (ow >= ow_lo)
          for (int j = 0; j < kw; ++j) {
            const int ow = w + pw - j * dw;
            if (ow >= 0 && ow < OW) acc = acc + sm[row + ow * t.ckp + j];
          }
        }
        slot -= dh;
        if (slot < 0) slot += t.rb;
      }
    } else {
      for (int i = 0; i < kh; ++i) {
        const int th = h + ph - i * dh;  // = oh·sh
        if (th < 0 || th % sh != 0 || th / sh >= OH) continue;
        const int row = ((th / sh) % t.rb) * row_stride + cbase + i * kw;
        for (int j = 0; j < kw; ++j) {
          const int tw2 = w + pw - j * dw;
          if (tw2 < 0 || tw2 % sw != 0 || tw2 / sw >= OW) continue;
          acc = acc + sm[row + (tw2 / sw) * t.ckp + j];
        }
      }
    }
    xo[int64_t(h) * W] = convert<T>(acc);
  }
}

// Variant 2's tile for g and accumulators of `acc_bytes`, or false when its ring does not fit (or the grid is
// too large): variant 1 runs then.
bool fold_tile(const UnfoldGeometry& g, int64_t acc_bytes, int ahead, FoldTile& t) {
  const int64_t khw = g.kh * g.kw;
  const int64_t rb = (g.kh - 1) * g.dh / g.sh + 1 + ahead;  // unclamped: the stride-1 slot walk needs dh < rb
  auto rw_of = [&](int64_t tw) { return std::min<int64_t>(g.OW, (tw - 1 + (g.kw - 1) * g.dw) / g.sw + 1); };
  auto smem = [&](int64_t cb, int64_t tw) { return rb * rw_of(tw) * ((cb * khw) | 1) * acc_bytes; };
  int64_t tw = std::min<int64_t>(g.W, 32);
  int64_t cb = std::min<int64_t>(g.C, std::max<int64_t>(1, kFoldThreads / tw));
  while (smem(cb, tw) > kFoldSmemMax && cb > 1) cb = (cb + 1) / 2;
  while (smem(cb, tw) > kFoldSmemMax && tw > 1) tw = (tw + 1) / 2;
  if (smem(cb, tw) > kFoldSmemMax) return false;
  const int64_t cchunks = (g.C + cb - 1) / cb, wtiles = (g.W + tw - 1) / tw;
  if (g.N * cchunks * wtiles > int64_t(0x7fffffff)) return false;
  t.cb = static_cast<int>(cb);
  t.tw = static_cast<int>(tw);
  t.rw = static_cast<int>(rw_of(tw));
  t.rb = static_cast<int>(rb);
  t.ckp = static_cast<int>((cb * khw) | 1);
  t.cchunks = static_cast<int>(cchunks);
  t.wtiles = static_cast<int>(wtiles);
  t.ahead = ahead;
  return true;
}

// Note [Unfold, staged kernel]
// Variant 2 of unfold2d (kernels/unfold.h). Variant 1 gives a CTA one column row and decomposes every entry k
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
// A copy: bit-identical to variant 1.
struct UnfoldTile {
  int cb = 1, tw = 1;  // channels and output columns per block
  int prow = 1, pcol = 1;  // patch rows (PH) and allocated patch columns (PW of a full tile)
  int offs_bytes = 0;      // the offset table's bytes, rounded up to 16
  int cchunks = 1, wtiles = 1;
};

template <class T>
__global__ void __launch_bounds__(kFoldThreads)
    unfold_staged_kernel(const T* __restrict__ x, UnfoldStrides4 xs, UnfoldGeometry g, UnfoldTile t,
                         T* __restrict__ cols) {
  extern __shared__ __align__(16) unsigned char unfold_smem[];
  int* offs = reinterpret_cast<int*>(unfold_smem);
  T* patch = reinterpret_cast<T*>(unfold_smem + t.offs_bytes);
  const int C = static_cast<int>(g.C), H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int OH = static_cast<int>(g.OH), OW = static_cast<int>(g.OW);
  const int kh = static_cast<int>(g.kh), kw = static_cast<int>(g.kw), sw = static_cast<int>(g.sw);
  const int dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int khw = kh * kw;
  int64_t b = blockIdx.x;
  const int wt = static_cast<int>(b % t.wtiles);
  b /= t.wtiles;
  const int cc = static_cast<int>(b % t.cchunks);
  b /= t.cchunks;
  const int oh = static_cast<int>(b % OH);
  const int64_t n = b / OH;
  const int c0 = cc * t.cb, cb = min(t.cb, C - c0);
  const int ow0 = wt * t.tw, tw = min(t.tw, OW - ow0);
  const int PH = t.prow, PW = t.pcol, pw_used = (tw - 1) * sw + (kw - 1) * dw + 1;
  const int h0 = oh * static_cast<int>(g.sh) - static_cast<int>(g.ph), w0 = ow0 * sw - static_cast<int>(g.pw);
  const int cbk = cb * khw, tid = threadIdx.x;
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

// Variant 2's unfold tile for g and elements of `elem` bytes, or false (variant 1 runs then).
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

std::atomic<int> g_unfold_variant_override{0};
std::atomic<int64_t> g_unfold_staged_launches{0};

int env_unfold_variant() {
  // old (1): the default until variant 2 is measured
  static const int v = env_variant("HADATRAIN_UNFOLD_KERNEL", {{"old", 1}, {"staged", 2}}, 1, 1);
  return v;
}

std::atomic<int> g_fold_variant_override{0};
std::atomic<int64_t> g_fold_staged_launches{0};

int env_fold_variant() {
  // old (1): the default until variants 2 and 3 are measured
  static const int v = env_variant("HADATRAIN_FOLD_KERNEL", {{"old", 1}, {"staged", 2}, {"ahead", 3}}, 1, 1);
  return v;
}

}  // namespace

int unfold_variant() {
  const int o = g_unfold_variant_override.load(std::memory_order_relaxed);
  return o >= 1 && o <= kUnfoldVariants ? o : env_unfold_variant();
}
void set_unfold_variant(int variant) { g_unfold_variant_override.store(variant, std::memory_order_relaxed); }
int64_t unfold_staged_launches() { return g_unfold_staged_launches.load(std::memory_order_relaxed); }

int fold_variant() {
  const int o = g_fold_variant_override.load(std::memory_order_relaxed);
  return o >= 1 && o <= kFoldVariants ? o : env_fold_variant();
}
void set_fold_variant(int variant) { g_fold_variant_override.store(variant, std::memory_order_relaxed); }
int64_t fold_staged_launches() { return g_fold_staged_launches.load(std::memory_order_relaxed); }

void launch_unfold2d(DType dt, const void* x, UnfoldStrides4 xs, const UnfoldGeometry& g, void* cols,
                     cudaStream_t stream) {
  const int64_t total = g.N * g.OH * g.OW * g.C * g.kh * g.kw;
  if (total == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    UnfoldTile t;
    if (unfold_variant() == 2 && unfold_tile(g, int64_t(sizeof(T)), t)) {
      const size_t smem = size_t(t.offs_bytes) + size_t(t.cb) * t.prow * t.pcol * sizeof(T);
      const unsigned blocks = static_cast<unsigned>(g.N * g.OH * t.cchunks * t.wtiles);
      unfold_staged_kernel<T><<<blocks, kFoldThreads, smem, stream>>>(static_cast<const T*>(x), xs, g, t,
                                                                      static_cast<T*>(cols));
      HT_CHECK_LAUNCH("unfold2d (staged)");
      g_unfold_staged_launches.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const int64_t rows = g.N * g.OH * g.OW;
    unfold_kernel<T><<<cuda::grid_for(rows * cuda::kBlock), cuda::kBlock, 0, stream>>>(static_cast<const T*>(x), xs, g,
                                                                        static_cast<T*>(cols));
    HT_CHECK_LAUNCH("unfold2d");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("unfold2d", dt);
}

void launch_fold2d(DType dt, const void* cols, FoldStrides3 cs, const UnfoldGeometry& g, void* x,
                   cudaStream_t stream) {
  const int64_t total = g.N * g.C * g.H * g.W;
  if (total == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    FoldTile t;
    const int variant = fold_variant();
    if (variant >= 2 && fold_tile(g, int64_t(sizeof(acc_t<T>)), variant == 3 ? 1 : 0, t)) {
      t.pairs = sizeof(T) == 2 && cs.k == 1 && cs.l % 2 == 0 && cs.n % 2 == 0 && aligned_to(cols, 4);
      const size_t smem = size_t(t.rb) * t.rw * t.ckp * sizeof(acc_t<T>);
      const unsigned blocks = static_cast<unsigned>(g.N * t.cchunks * t.wtiles);
      if (g.sh == 1 && g.sw == 1)
        fold_staged_kernel<T, true><<<blocks, kFoldThreads, smem, stream>>>(static_cast<const T*>(cols), cs, g, t,
                                                                          static_cast<T*>(x));
      else
        fold_staged_kernel<T, false><<<blocks, kFoldThreads, smem, stream>>>(static_cast<const T*>(cols), cs, g, t,
                                                                           static_cast<T*>(x));
      HT_CHECK_LAUNCH("fold2d (staged)");
      g_fold_staged_launches.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    fold_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(static_cast<const T*>(cols), cs, g,
                                                                      static_cast<T*>(x));
    HT_CHECK_LAUNCH("fold2d");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("fold2d", dt);
}

}  // namespace ht::kernels
