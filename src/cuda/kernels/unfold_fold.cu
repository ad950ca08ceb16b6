// fold (col2im, unfold's adjoint) kernels and launch_fold2d (see unfold.cuh): the gather kernel (a thread per
// image element), the tiles kernel (Note [Fold, tiles kernel]) and its halo form for 3x3 windows (Note [Fold,
// tiles2]), picked by shape in launch_fold2d. Formulas read side by side with src/ops/unfold.cpp: every kernel
// sums in the CPU's ascending (i, j) order in fp32 (fp64 for f64), so the bits are the CPU's. The unfold kernels
// are in unfold.cu; unfold_common.cuh holds what the two share.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/convert.cuh"
#include "cuda/kernels/kernel_launch.cuh"
#include "cuda/kernels/unfold.cuh"
#include "cuda/kernels/unfold_common.cuh"

namespace ht::kernels {
namespace {
using namespace uf;

// The output position o of a window offset t = o·s (the position along one axis plus the padding, less the tap's
// dilated offset), or -1 when there is none: t < 0, s does not divide t, or o >= limit. Unsigned arithmetic, so a
// compile-time s is a mask and a shift (s = 2) or nothing at all (s = 1).
__device__ __forceinline__ int window_index(int t, int s, int limit) {
  if (t < 0) return -1;
  const unsigned u = static_cast<unsigned>(t), us = static_cast<unsigned>(s);
  return u % us == 0 && u / us < static_cast<unsigned>(limit) ? static_cast<int>(u / us) : -1;
}

// One thread per image element, gathering its column entries in ascending (i, j) order (the CPU's order).
// CL: x is channels-last, (N, H, W, C) in memory, and the element index runs c fastest (so a warp's stores are
// contiguous and its reads fall in one column run per position).
template <class T, bool CL = false>
__global__ void fold_kernel(const T* __restrict__ cols, FoldStrides3 cs, UnfoldGeometry g, T* __restrict__ x) {
  using A = acc_t<T>;
  const int W = static_cast<int>(g.W), OH = static_cast<int>(g.OH), OW = static_cast<int>(g.OW);
  const int kh = static_cast<int>(g.kh), kw = static_cast<int>(g.kw), sh = static_cast<int>(g.sh), sw = static_cast<int>(g.sw);
  const int ph = static_cast<int>(g.ph), pw = static_cast<int>(g.pw), dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int64_t HW = g.H * g.W, total = g.N * g.C * HW;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t n, c;
    int hw;
    if constexpr (CL) {
      const int64_t pix = e / g.C;  // n·HW + hw
      c = e - pix * g.C;
      n = pix / HW;
      hw = static_cast<int>(pix - n * HW);
    } else {
      const int64_t plane = e / HW;
      n = plane / g.C;
      c = plane - n * g.C;
      hw = static_cast<int>(e - plane * HW);
    }
    const int h = hw / W, w = hw - h * W;
    const T* base = cols + n * cs.n;
    A acc = A(0);
    for (int i = 0; i < kh; ++i) {
      const int oh = window_index(h + ph - i * dh, sh, OH);
      if (oh < 0) continue;
      for (int j = 0; j < kw; ++j) {
        const int ow = window_index(w + pw - j * dw, sw, OW);
        if (ow < 0) continue;
        acc = acc + convert<A>(base[(int64_t(oh) * OW + ow) * cs.l + ((c * kh + i) * kw + j) * cs.k]);
      }
    }
    x[e] = convert<T>(acc);
  }
}

// Note [Fold, tiles kernel]
// fold_kernel gives a thread one image element and reads its kh·kw column entries directly: neighbouring
// threads (w, w+1) read addresses C·kh·kw elements apart, so every 2-byte read costs a 32-byte sector (~16x read
// amplification on (N, L, C·3·3) bf16 columns; about 0.1 of the copy rate). Here a block owns (n, a group of cb
// channels, a chunk of R image rows h0..h0+R-1, a tile of tw image columns w0..w0+tw-1) and has no walk:
// 1. it stages, in one pass, every column row oh its rows need (oh·sh = h + ph - i·dh for some h of the chunk and
//    some i: at most rr = (R-1 + (kh-1)·dh) / sh + 1 rows) x the positions ow its tile reaches (halo included, at
//    most rw) x the cb·kh·kw entries of its channels, into shared memory in the column dtype (bf16 stays 2 bytes).
//    With contiguous columns the entries of a position are one run of cb·kh·kw elements; the host picks the
//    widest load unit (16 bytes, 4 bytes, one element) that every run's start and length and the row / image
//    strides allow (C 64 3x3 bf16, cb 8: 144-byte runs at 144-byte aligned offsets, 9 loads of 16 bytes). The
//    loop over (row, position, unit) steps its indices without divisions and issues its loads in batches (6 of
//    16 bytes, 8 of 8, 12 narrower: the most that fit 64 registers without spills) back to back before storing
//    them; one batch or two cover a thread's share on the ResNet shapes;
// 2. one __syncthreads();
// 3. its threads sum the cb·R·tw image elements (w fastest: a warp's stores are contiguous; several elements a
//    thread), each from shared memory in ascending (i, j) order in fp32 (fp64 for f64, the conversions are exact)
//    and rounded once: the same additions in the same order as fold_kernel and the CPU, so the bits are the same.
// A staged position's stride ckp (elements) is an odd number of 4-byte words (of 8-byte elements for f64), so a
// warp over 32 consecutive w reads 32 banks; 16-byte units are therefore stored as 4 words (a position is only
// 4-byte aligned). Blocks are numbered w tile fastest, then row chunk, then channel group, then n: the blocks that
// share halo column rows (adjacent row chunks) and the partial sectors between channel groups run close together
// and the repeats come from L2.
// Tile rule (fold_tiles_plan): tw = min(W, 32) (rows of the image written 64 bytes or more at a time in bf16);
// cb = the smallest count (<= C) whose run is >= 128 bytes and a multiple of 16 (C 64 3x3: bf16 8, f32 4, f64 2);
// cb, then tw, halved while one row (R = 1) does not fit 48 KB (no opt-in; the shape falls back to the gather
// kernel when nothing fits); R = the most rows that fit (<= H, <= 64, <= 16 elements a thread); cb doubled while a block
// has fewer elements than threads (small images); R halved (not below 4) while there are fewer than 1024 blocks
// (several waves of 132 SMs at 4 blocks each). ResNet shapes (bf16, N 256): C 64 32x32 3x3 cb 8, tw 32, R 8
// (46 KB, 8192 blocks, 4 an SM); C 128 16x16 cb 8, tw 16, R 16 (37 KB, 4096 blocks); C 512 4x4 cb 16, R 4
// (8192 blocks); C 64 56x56 (N 64) cb 8, tw 32, R 7 (44 KB, 8192 blocks).
// Note [Fold, tiles2]
// The tiles kernel with HALO for 3x3 windows at stride and dilation 1 in f32 / bf16 / f16 (the K3 sum; other
// shapes and f64 run the tiles kernel without it). A profile found the tiles kernel issue-bound; in K3's unrolled sum about half the instructions per element are the
// bounds checks of its nine entries (row and column inside the column grid: compares, predicate ANDs, branches),
// and a warp over 32 image columns always holds border elements, so an "interior elements skip the checks"
// branch would diverge in every warp. Instead the stage is padded: a block stages the R + 2 column rows
// h0 + ph - 2 .. h0 + R - 1 + ph and the tw + 2 positions w0 + pw - 2 .. w0 + tw - 1 + pw without clipping them
// to the column grid, zeros where a row or position lies outside it (no load), and every element sums its nine
// staged entries unconditionally in the same ascending (i, j) order. The bits are the same: the sum starts at +0
// and adds in round-to-nearest, so it is never -0 (+0 + -0 = +0), and x + (+0) = x for every other x (a NaN stays
// a NaN of the same bits: it came from an add, as without the halo). Costs: the stage holds 2 more positions a row
// (fold_tiles_plan's halo bounds, still <= 48 KB: C 64 32x32 bf16 cb 8 gets R 7 instead of 8) and stores zeros
// for the outside ones (on 4x4 images 36 staged positions for 16 elements); level with or faster than the tiles
// kernel without it on every ResNet shape.
// Note [Fold, channels-last output]
// With channels_last the fold writes x as (N, H, W, C) in memory (the layout of a channels-last network's
// activations, so that its gradient needs no transpose afterwards). Staging, tiles and sums are the NCHW kernel's;
// only the order in which a block's threads take its elements changes, c fastest, so a warp stores runs of cb
// consecutive channels (16 bytes and more for bf16 3x3 windows) instead of runs of tw image columns. The sums, and
// so the bits, are the same.
constexpr int kTilesMinBlocks = 1024;
constexpr int kTilesMinRows = 4;
constexpr int kTilesMaxPerThread = 16;  // image elements a thread sums at most (caps R)
constexpr int kTilesRunBytes = 128;     // the channel group's run per position, at least (when C allows)

struct FoldTiles {
  int cb = 1, tw = 1, R = 1;  // channels, image columns, image rows per block
  int rr = 1, rw = 1;         // staged column rows and positions per row (bounds over every block)
  int ckp = 1;                // shared-memory stride of a staged position, in elements of T
  int cchunks = 1, rchunks = 1, wtiles = 1;
  int vb = 1;  // bytes of a load unit: 16, 4 or sizeof(T)
};

// Stride of a staged position holding `cbk` entries of `sz` bytes: an odd number of 4-byte words (8-byte
// elements for f64), so that 32 consecutive positions fall in 32 banks.
int64_t tiles_ckp(int64_t cbk, int64_t sz) {
  if (sz == 8) return cbk | 1;
  int64_t words = (cbk * sz + 3) / 4;
  if (words % 2 == 0) ++words;
  return words * 4 / sz;
}

// S: the stride of both axes when it is 1 or 2 (the ResNet convolutions), 0 for any other (read from g): window_index
// then divides by a compile-time stride rather than the runtime one (an integer division per tap: with a 3x3 window
// it made the strided fold issue-bound at a fifth of the stride-1 kernel's rate). The taps and their order are the
// same.
// K3: a 3x3 window with stride and dilation 1 (S == 1 too; the ResNet convolutions): the sum unrolled with
// compile-time offsets, the same additions in the same order.
// HALO (K3 only; Note [Fold, tiles2]): the stage spans every column row and position the 3x3 windows
// of the block's elements name, out-of-range ones as zeros, and the sum has no bounds checks.
// CL: x is channels-last ((N, H, W, C) in memory); the block's elements are then taken c fastest (Note [Fold,
// channels-last output]).
template <class T, int VB, int S, bool K3, bool HALO = false, bool CL = false>
__global__ void __launch_bounds__(kFoldThreads, 4)
    fold_tiles_kernel(const T* __restrict__ cols, FoldStrides3 cs, UnfoldGeometry g, FoldTiles t, T* __restrict__ x) {
  using A = acc_t<T>;
  constexpr int kSz = static_cast<int>(sizeof(T));
  static_assert(VB == kSz || VB == 16 || (VB == 4 && kSz == 2), "load unit");
  // a 16-byte unit as 4 words, a pair of 2-byte elements as one word, else one element
  using U = std::conditional_t<VB == 16, uint4, std::conditional_t<VB == 4 && kSz == 2, uint32_t, T>>;
  constexpr int kLoads = VB == 16 ? 6 : VB == 8 ? 8 : 12;  // loads a thread issues back to back
  extern __shared__ __align__(16) unsigned char tiles_smem[];
  const int C = static_cast<int>(g.C), H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int OH = static_cast<int>(g.OH), OW = static_cast<int>(g.OW);
  const int kh = static_cast<int>(g.kh), kw = static_cast<int>(g.kw);
  const int sh = S != 0 ? S : static_cast<int>(g.sh), sw = S != 0 ? S : static_cast<int>(g.sw);
  const int ph = static_cast<int>(g.ph), pw = static_cast<int>(g.pw), dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int khw = kh * kw;
  int64_t b = blockIdx.x;
  const int wt = static_cast<int>(b % t.wtiles);
  b /= t.wtiles;
  const int rc = static_cast<int>(b % t.rchunks);
  b /= t.rchunks;
  const int cc = static_cast<int>(b % t.cchunks);
  const int64_t n = b / t.cchunks;
  const int c0 = cc * t.cb, cb = min(t.cb, C - c0);
  const int h0 = rc * t.R, R = min(t.R, H - h0);
  const int w0 = wt * t.tw, tw = min(t.tw, W - w0);
  const int cbk = cb * khw;
  const int hl = h0 + ph - (kh - 1) * dh, wl = w0 + pw - (kw - 1) * dw;
  constexpr bool S1 = S == 1;
  static_assert(!K3 || S1, "the unrolled 3x3 sum is for stride 1");
  static_assert(!HALO || (S1 && K3), "the halo stage is for 3x3 windows at stride and dilation 1");
  // HALO: unclipped (R + 2 rows, tw + 2 positions, some outside the column grid)
  const int oh_lo = HALO ? hl : hl <= 0 ? 0 : (S1 ? hl : (hl + sh - 1) / sh);
  const int oh_hi = HALO ? h0 + R - 1 + ph : min(S1 ? h0 + R - 1 + ph : (h0 + R - 1 + ph) / sh, OH - 1);
  const int ow_lo = HALO ? wl : wl <= 0 ? 0 : (S1 ? wl : (wl + sw - 1) / sw);
  const int ow_hi = HALO ? w0 + tw - 1 + pw : min(S1 ? w0 + tw - 1 + pw : (w0 + tw - 1 + pw) / sw, OW - 1);
  const int nr = oh_hi - oh_lo + 1, rw = ow_hi - ow_lo + 1;  // <= 0: nothing reaches the block (zeros)
  const int tid = threadIdx.x;
  const int pos_bytes = t.ckp * kSz, row_bytes = t.rw * pos_bytes;
  if (nr > 0 && rw > 0) {
    const T* cn = cols + n * cs.n + int64_t(c0) * khw * cs.k;  // + the staged row's and position's offset
    if constexpr (!HALO) cn += (int64_t(oh_lo) * OW + ow_lo) * cs.l;
    constexpr int kUnitElems = VB / kSz;
    const int ent = cbk / kUnitElems;  // units per position (the host checked cbk·sizeof(T) % VB == 0)
    const int per = nr * rw * ent;
    const int dp = kFoldThreads / ent, dk = kFoldThreads - dp * ent;
    const int q0 = tid / ent;
    int r = q0 / rw, p = q0 - (q0 / rw) * rw, k = tid - q0 * ent;  // row, position, unit of the next store
    auto step = [&](int& sr, int& sp, int& sk) {
      sp += dp;
      sk += dk;
      if (sk >= ent) {
        sk -= ent;
        ++sp;
      }
      if (sp >= rw) {
        const int q = sp / rw;
        sr += q;
        sp -= q * rw;
      }
    };
    for (int e = tid; e < per; e += kLoads * kFoldThreads) {
      U v[kLoads];
      int lr = r, lp = p, lk = k;
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        if (e + u * kFoldThreads < per) {
          if constexpr (HALO) {  // zeros outside the column grid (Note [Fold, tiles2]: adding +0 changes no sum)
            const int oh = oh_lo + lr, ow = ow_lo + lp;
            if (oh >= 0 && oh < OH && ow >= 0 && ow < OW)
              v[u] = *reinterpret_cast<const U*>(cn + (int64_t(oh) * OW + ow) * cs.l + int64_t(lk * kUnitElems) * cs.k);
            else
              v[u] = U{};
          } else {
            v[u] = *reinterpret_cast<const U*>(cn + (int64_t(lr) * OW + lp) * cs.l + int64_t(lk * kUnitElems) * cs.k);
          }
        }
        step(lr, lp, lk);
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        if (e + u * kFoldThreads < per) {
          unsigned char* d = tiles_smem + r * row_bytes + p * pos_bytes + k * VB;
          if constexpr (VB == 16) {  // a position is 4-byte aligned: four word stores
            uint32_t* dw4 = reinterpret_cast<uint32_t*>(d);
            dw4[0] = v[u].x;
            dw4[1] = v[u].y;
            dw4[2] = v[u].z;
            dw4[3] = v[u].w;
          } else {
            *reinterpret_cast<U*>(d) = v[u];
          }
        }
        step(r, p, k);
      }
    }
  }
  __syncthreads();
  const T* sm = reinterpret_cast<const T*>(tiles_smem);
  const int total = cb * R * tw;
  const int rstride = t.rw * t.ckp;  // elements between staged column rows
  // The image element (c, ri, wi) of the block: its staged entries summed in ascending (i, j) order.
  auto sum_at = [&](int c, int ri, int wi) {
    const int h = h0 + ri, w = w0 + wi;
    const int cbase = c * khw - ow_lo * t.ckp;  // + (oh - oh_lo)·rstride + ow·ckp + i·kw + j >= 0
    A acc = A(0);
    if constexpr (K3) {
      const int ohb = h + ph, owb = w + pw;
      const T* base = sm + cbase + (ohb - oh_lo) * rstride + owb * t.ckp;
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const bool row_in = HALO || (ohb - i >= 0 && ohb - i < OH);
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          if (row_in && (HALO || (owb - j >= 0 && owb - j < OW)))
            acc = acc + convert<A>(base[i * (3 - rstride) + j * (1 - t.ckp)]);
        }
      }
    } else {
      for (int i = 0; i < kh; ++i) {
        const int oh = window_index(h + ph - i * dh, sh, OH);
        if (oh < 0) continue;
        const int row = cbase + (oh - oh_lo) * rstride + i * kw;
        for (int j = 0; j < kw; ++j) {
          const int ow = window_index(w + pw - j * dw, sw, OW);
          if (ow < 0) continue;
          acc = acc + convert<A>(sm[row + ow * t.ckp + j]);
        }
      }
    }
    return acc;
  };
  if constexpr (CL) {
    // element e = (ri·tw + wi)·cb + c: a warp stores runs of cb consecutive channels of neighbouring pixels;
    // stepped by the block size without divisions (dc < cb and wi + dwq + 1 < 2·tw: one carry each)
    T* xb = x + (n * H + h0) * int64_t(W) * C + int64_t(w0) * C + c0;
    const int dc = kFoldThreads % cb, dq = kFoldThreads / cb, dwq = dq % tw, drq = dq / tw;
    int c = tid % cb, wi = (tid / cb) % tw, ri = (tid / cb) / tw;
    for (int e = tid; e < total; e += kFoldThreads) {
      xb[(int64_t(ri) * W + wi) * C + c] = convert<T>(sum_at(c, ri, wi));
      c += dc;
      int carry = 0;
      if (c >= cb) {
        c -= cb;
        carry = 1;
      }
      wi += dwq + carry;
      ri += drq;
      if (wi >= tw) {
        wi -= tw;
        ++ri;
      }
    }
  } else {
    T* xb = x + ((n * C + c0) * H + h0) * int64_t(W) + w0;
    // element e = (c·R + ri)·tw + wi, stepped by the block size without divisions
    const int dq = kFoldThreads / tw, dwi = kFoldThreads - dq * tw;
    int wi = tid % tw, ri = tid / tw, c = ri / R;
    ri -= c * R;
    for (int e = tid; e < total; e += kFoldThreads) {
      xb[(int64_t(c) * H + ri) * W + wi] = convert<T>(sum_at(c, ri, wi));
      wi += dwi;
      ri += dq;
      if (wi >= tw) {
        wi -= tw;
        ++ri;
      }
      if (ri >= R) {  // one division only when the step crosses channels
        const int qc = ri / R;
        c += qc;
        ri -= qc * R;
      }
    }
  }
}

// The tiles for g and column elements of `sz` bytes (Note [Fold, tiles kernel]), or false when one image row
// of one channel and column does not fit in 48 KB (or the grid is too large): the gather kernel runs then.
// The load unit t.vb is the launcher's (it depends on the column pointer and strides).
// halo (3x3 stride-1 windows, Note [Fold, tiles2]): the staged rows and positions are not clipped to
// the column grid (R + 2 rows x tw + 2 positions).
bool fold_tiles_plan(const UnfoldGeometry& g, int64_t sz, FoldTiles& t, bool halo = false) {
  const int64_t khw = g.kh * g.kw;
  const int64_t ow_cap = halo ? INT64_MAX : g.OW, oh_cap = halo ? INT64_MAX : g.OH;
  auto rw_of = [&](int64_t tw) { return std::min<int64_t>(ow_cap, (tw - 1 + (g.kw - 1) * g.dw) / g.sw + 1); };
  auto rr_of = [&](int64_t R) { return std::min<int64_t>(oh_cap, (R - 1 + (g.kh - 1) * g.dh) / g.sh + 1); };
  auto smem = [&](int64_t cb, int64_t tw, int64_t R) { return rr_of(R) * rw_of(tw) * tiles_ckp(cb * khw, sz) * sz; };
  auto blocks = [&](int64_t cb, int64_t tw, int64_t R) {
    return g.N * ((g.C + cb - 1) / cb) * ((g.H + R - 1) / R) * ((g.W + tw - 1) / tw);
  };
  int64_t tw = std::min<int64_t>(g.W, 32), cb = 1;
  while (cb < g.C && (cb * khw * sz < kTilesRunBytes || cb * khw * sz % 16 != 0)) ++cb;
  while (smem(cb, tw, 1) > kFoldSmemMax && cb > 1) cb = (cb + 1) / 2;
  while (smem(cb, tw, 1) > kFoldSmemMax && tw > 1) tw = (tw + 1) / 2;
  if (smem(cb, tw, 1) > kFoldSmemMax) return false;
  const int64_t rmax =
      std::min<int64_t>({g.H, 64, std::max<int64_t>(1, kFoldThreads * kTilesMaxPerThread / (cb * tw))});
  int64_t R = 1;
  while (R < rmax && smem(cb, tw, R + 1) <= kFoldSmemMax) ++R;
  while (cb * R * tw < kFoldThreads && cb < g.C && smem(std::min(g.C, 2 * cb), tw, R) <= kFoldSmemMax)
    cb = std::min(g.C, 2 * cb);
  while (blocks(cb, tw, R) < kTilesMinBlocks && R > kTilesMinRows) R = std::max<int64_t>(kTilesMinRows, R / 2);
  if (blocks(cb, tw, R) > int64_t(0x7fffffff)) return false;
  t.cb = static_cast<int>(cb);
  t.tw = static_cast<int>(tw);
  t.R = static_cast<int>(R);
  t.rr = static_cast<int>(rr_of(R));
  t.rw = static_cast<int>(rw_of(tw));
  t.ckp = static_cast<int>(tiles_ckp(cb * khw, sz));
  t.cchunks = static_cast<int>((g.C + cb - 1) / cb);
  t.rchunks = static_cast<int>((g.H + R - 1) / R);
  t.wtiles = static_cast<int>((g.W + tw - 1) / tw);
  t.vb = static_cast<int>(sz);
  return true;
}

constinit LaunchCounter g_fold_tiles_launches, g_fold_tiles2_launches;

}  // namespace

int64_t fold_tiles_launches() { return g_fold_tiles_launches.get(); }
int64_t fold_tiles2_launches() { return g_fold_tiles2_launches.get(); }

void launch_fold2d(DType dt, const void* cols, FoldStrides3 cs, const UnfoldGeometry& g, void* x, bool channels_last,
                   cudaStream_t stream) {
  const int64_t total = g.N * g.C * g.H * g.W;
  if (total == 0) return;
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    FoldTiles tt;
    const bool s1 = g.sh == 1 && g.sw == 1, s2 = g.sh == 2 && g.sw == 2;
    const bool k3 = s1 && g.kh == 3 && g.kw == 3 && g.dh == 1 && g.dw == 1;
    // the halo stage for the unrolled 3x3 sum (not f64, which keeps the generic loop), else tiles, else the
    // gather kernel
    bool halo = k3 && sizeof(T) < 8;
    bool planned = fold_tiles_plan(g, int64_t(sizeof(T)), tt, halo);
    if (!planned && halo) {
      halo = false;
      planned = fold_tiles_plan(g, int64_t(sizeof(T)), tt);
    }
    if (planned) {
      const int64_t khw = g.kh * g.kw, sz = int64_t(sizeof(T));
      // the widest load unit that every run's start and length and the strides allow
      auto unit_ok = [&](int64_t vb) {
        return vb > sz && cs.k == 1 && aligned_to(cols, static_cast<unsigned>(vb)) && cs.n * sz % vb == 0 &&
               cs.l * sz % vb == 0 && tt.cb * khw * sz % vb == 0 && g.C * khw * sz % vb == 0;
      };
      tt.vb = unit_ok(16) ? 16 : unit_ok(4) ? 4 : static_cast<int>(sz);
      const size_t smem = size_t(tt.rr) * tt.rw * tt.ckp * sizeof(T);
      const unsigned blocks = static_cast<unsigned>(g.N * tt.cchunks * tt.rchunks * tt.wtiles);
      const T* c = static_cast<const T*>(cols);
      T* o = static_cast<T*>(x);
      auto go = [&](auto vb_tag, auto cl_tag) {
        constexpr int VB = decltype(vb_tag)::value;
        constexpr bool CL = decltype(cl_tag)::value;
        if constexpr (sizeof(T) < 8) {  // f64 keeps the generic loop (the unrolled one spills 12 bytes there)
          if (halo) {
            fold_tiles_kernel<T, VB, 1, true, true, CL><<<blocks, kFoldThreads, smem, stream>>>(c, cs, g, tt, o);
            return;
          }
          if (k3) {
            fold_tiles_kernel<T, VB, 1, true, false, CL><<<blocks, kFoldThreads, smem, stream>>>(c, cs, g, tt, o);
            return;
          }
        }
        if (s1) fold_tiles_kernel<T, VB, 1, false, false, CL><<<blocks, kFoldThreads, smem, stream>>>(c, cs, g, tt, o);
        else if (s2) fold_tiles_kernel<T, VB, 2, false, false, CL><<<blocks, kFoldThreads, smem, stream>>>(c, cs, g, tt, o);
        else fold_tiles_kernel<T, VB, 0, false, false, CL><<<blocks, kFoldThreads, smem, stream>>>(c, cs, g, tt, o);
      };
      auto go_vb = [&](auto cl_tag) {
        if (tt.vb == 16) go(std::integral_constant<int, 16>{}, cl_tag);
        else if constexpr (sizeof(T) == 2) {
          if (tt.vb == 4) go(std::integral_constant<int, 4>{}, cl_tag);
          else go(std::integral_constant<int, 2>{}, cl_tag);
        } else {
          go(std::integral_constant<int, int(sizeof(T))>{}, cl_tag);
        }
      };
      if (channels_last) go_vb(std::true_type{});
      else go_vb(std::false_type{});
      HT_CHECK_LAUNCH("fold2d (tiles)");
      g_fold_tiles_launches.add();
      if (halo) g_fold_tiles2_launches.add();
      return;
    }
    if (channels_last)
      fold_kernel<T, true><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(static_cast<const T*>(cols), cs, g,
                                                                              static_cast<T*>(x));
    else
      fold_kernel<T><<<cuda::grid_for(total), cuda::kBlock, 0, stream>>>(static_cast<const T*>(cols), cs, g,
                                                                        static_cast<T*>(x));
    HT_CHECK_LAUNCH("fold2d");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("fold2d", dt);
}

}  // namespace ht::kernels
