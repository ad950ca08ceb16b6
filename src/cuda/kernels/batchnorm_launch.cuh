// Internals of the batch-norm kernels shared by cuda/kernels/batchnorm*.cu (the interface is batchnorm.cuh): the
// block and grid constants, the launch geometry of the split grids (ClGrid channels last, CfGrid channels
// first), the host helpers of the launchers, and the launch functions of the kernel families that the public
// launchers in batchnorm.cu pick between:
//   batchnorm_reduce.cu  the reductions (statistics, backward sums) on the split grids, their finalize kernels,
//                        and the eval statistics;
//   batchnorm_map.cu     normalize and dx on the split grids;
//   batchnorm_cl2.cu     the channels-last ticket reductions (Note [Batch-norm channels-last tickets]).
// batchnorm.cu holds the ticket buffer, the kernel choice and the public launchers; batchnorm_common.cuh the
// device helpers. Included by .cu files only.
#pragma once
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "cuda/kernels/batchnorm.cuh"
#include "cuda/kernels/map.cuh"  // Pack, kVec, convert

namespace ht::kernels::bn {

constexpr int kThreads = 256;
constexpr int64_t kTargetBlocks = 132 * 8;  // about one wave of resident 256-thread blocks on an H200
// Channels-last grids: one wave of the 4 blocks per SM their launch bounds allow (half the partial
// rows of kTargetBlocks, the channels-first target, for the finalize kernel to add).
constexpr int64_t kTargetBlocksCl = 132 * 4;
// Resident blocks per SM of the channels-last backward kernels (fewer registers would spill): dx 3,
// the sums 4 (3 with a fused activation, which needs the forward's constants too).
template <BnAct Act>
inline constexpr int kClBlocks = Act == BnAct::none ? 4 : 3;
constexpr int64_t kTargetBlocksClDx = 132 * 3;

// ---- launch geometry ------------------------------------------------------------------------------------

// Channels last: x (M, C), C = CV packs of V.
struct ClGrid {
  int64_t CV = 0;
  int64_t rows_per_block = 0;
  dim3 block, grid;
};

inline ClGrid cl_grid(int64_t M, int64_t C, int V, int64_t target_blocks) {
  ClGrid g;
  g.CV = C / V;
  const int tx = static_cast<int>(std::min<int64_t>(g.CV, kThreads));
  const int ty = kThreads / tx;
  g.block = dim3(tx, ty);
  const int64_t gx = (g.CV + tx - 1) / tx;
  const int64_t target = std::max<int64_t>(1, target_blocks / gx);
  int64_t rpb = std::max<int64_t>((M + target - 1) / target, 2 * ty);  // at least two rows per thread
  rpb = std::max<int64_t>(rpb, (M + 65534) / 65535);
  const int64_t gy = std::max<int64_t>(1, (M + rpb - 1) / rpb);
  g.rows_per_block = rpb;
  g.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  return g;
}

// Channels first: channel c's values are N planes of S; SV = S / V packs per plane.
struct CfGrid {
  int64_t SV = 0, per_channel = 0, chunk = 0;  // packs per plane, per channel, per block
  FastDiv div_sv;
  bool fast = false;  // per_channel < 2^31: FastDiv applies
  dim3 grid;
};

inline CfGrid cf_grid(const BnShape& s, int V) {
  CfGrid g;
  g.SV = s.S / V;
  g.per_channel = s.N * g.SV;
  g.fast = g.per_channel < (int64_t{1} << 31) && g.SV < (int64_t{1} << 31);
  if (g.fast) g.div_sv = FastDiv(static_cast<uint32_t>(std::max<int64_t>(g.SV, 1)));
  int64_t splits = std::max<int64_t>(1, kTargetBlocks / std::max<int64_t>(s.C, 1));
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, g.per_channel / (kThreads * 4)));  // >= 4 packs a thread
  splits = std::min<int64_t>(splits, 65535);
  g.chunk = std::max<int64_t>(1, (g.per_channel + splits - 1) / splits);
  const int64_t gy = std::max<int64_t>(1, (g.per_channel + g.chunk - 1) / g.chunk);
  g.grid = dim3(static_cast<unsigned>(s.C), static_cast<unsigned>(gy));
  return g;
}

// ---- host helpers ---------------------------------------------------------------------------------------

// Device scratch memory in `stream`'s order from the device's default memory pool (the pool the caching
// allocator draws from, so freed blocks are cached and reused); freed in the same order at scope exit.
class Scratch {
 public:
  Scratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) HT_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
  }
  ~Scratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);  // errors here surface at the next checked call
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  double* get() const { return static_cast<double*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// The pack width to use: kVec<T> when the layout's contiguous run (C channels last, S channels first) is a
// multiple of it and every pointer is 16-byte aligned; 1 otherwise.
template <class T>
bool vectorizable(const BnShape& s, std::initializer_list<const void*> ptrs) {
  constexpr int V = kVec<T>;
  const int64_t run = s.S == 1 ? s.C : s.S;
  if (run % V != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned_to(p, 16)) return false;
  return true;
}

// Calls f(T{}, std::integral_constant<int, V>{}) with the pack width chosen by vectorizable.
template <class F>
bool visit_bn(DType dt, const BnShape& s, std::initializer_list<const void*> ptrs, F&& f) {
  return visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    if (vectorizable<T>(s, ptrs)) f(tag, std::integral_constant<int, kVec<T>>{});
    else f(tag, std::integral_constant<int, 1>{});
  });
}

// Calls f(std::integral_constant<BnAct, act>{}).
template <class F>
void visit_act(BnAct act, F&& f) {
  if (act == BnAct::relu) f(std::integral_constant<BnAct, BnAct::relu>{});
  else if (act == BnAct::add_relu) f(std::integral_constant<BnAct, BnAct::add_relu>{});
  else f(std::integral_constant<BnAct, BnAct::none>{});
}

// visit_bn, then visit_act: f(T{}, std::integral_constant<int, V>{}, std::integral_constant<BnAct, act>{}).
template <class F>
void visit_bn_act(DType dt, const BnShape& s, std::initializer_list<const void*> ptrs, BnAct act, F&& f) {
  visit_bn(dt, s, ptrs, [&](auto tag, auto vtag) { visit_act(act, [&](auto atag) { f(tag, vtag, atag); }); });
}

inline unsigned finalize_blocks(int64_t C) { return static_cast<unsigned>((C + 7) / 8); }  // 8 warps a block

// Bytes of the partial sums (splits, 2, C).
inline std::size_t part_bytes(unsigned splits, int64_t C) {
  return static_cast<std::size_t>(splits) * 2 * C * sizeof(double);
}

// The tickets of the channels-first and channels-last reductions (Note [Batch-norm kernels] in batchnorm.cu):
// n (<= kTicketSlot) zeroed counters of the device's ring, or null (then the *_split kernels and a finalize
// launch run).
constexpr int64_t kTicketSlot = 4096;
unsigned* bn_tickets(int64_t n, cudaStream_t stream);

// The public launchers' arguments (batchnorm.cuh), handed to the kernel families. dt is supported (checked by
// the public launcher).
struct StatsArgs {
  DType dt;
  const void* x;
  BnShape s;
  double eps;
  BnRunning running;
  double* mean;
  double* invstd;
};
struct NormalizeArgs {
  DType dt;
  const void* x;
  BnShape s;
  BnChannels ch;
  void* y;
};
struct ReduceArgs {  // x null: ch.act none, no sum_gxhat / grad_weight (launch_bn_backward_reduce)
  DType dt;
  const void* g;
  const void* x;
  BnShape s;
  BnChannels ch;
  BnBackwardSums out;
};
struct DxArgs {  // x null unless read (launch_bn_backward_dx)
  DType dt;
  BnMode mode;
  const void* g;
  const void* x;
  BnShape s;
  BnChannels ch;
  const double* sum_g;
  const double* sum_gxhat;
  void* gx;
};

// batchnorm_reduce.cu: the split reductions (also the fallback of the ticket kernels); M == 0 included.
void stats_split(const StatsArgs& a, cudaStream_t stream);
void bwd_reduce_split(const ReduceArgs& a, cudaStream_t stream);
// batchnorm_map.cu: channels last and channels first.
void normalize_split(const NormalizeArgs& a, cudaStream_t stream);
void dx_split(const DxArgs& a, cudaStream_t stream);
// batchnorm_cl2.cu: x (M > 0, C) channels last; false (nothing launched) without a ticket slot.
bool stats_cl2(const StatsArgs& a, cudaStream_t stream);
bool bwd_reduce_cl2(const ReduceArgs& a, cudaStream_t stream);

}  // namespace ht::kernels::bn
