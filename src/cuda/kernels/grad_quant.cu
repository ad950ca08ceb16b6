// Launchers of the quantisation kernels of the gradient pipelines (grad_quant.cuh; Note [Bit-identical
// quantisation] in include/hadatrain/grad/quant.h). launch_grad_quant plans the launch (plan: fused or two
// passes, units or items) and dispatches to the kernel families (grad_quant_launch.cuh): the item kernels in
// grad_quant_items.cu, the unit kernels in grad_quant_units.cu. Pass 2 of the two-pass path (the group's m,
// r and scale from the partial statistics; a known m needs none, Note [Known m in pass 3]; one group's pass 3 runs
// it itself, Note [Pass 2 in pass 3]) is family-neutral and lives here, with the kernels of the other entry points:
// absmax, the blockwise Hadamard rotation and int4 packing.
#include <algorithm>

#include "cuda/kernels/grad_quant_common.cuh"

namespace ht::kernels::gq {
namespace {

// Pass 2: one block per group combines its parts in a fixed order, writes m, r and the scale.
template <bool kSawb>
__global__ void __launch_bounds__(kThreads) quant_finalize_kernel(GradQuantArgs a, Geo g, Workspace ws) {
  __shared__ Stats smem[32];
  for (int64_t grp = blockIdx.x; grp < g.groups; grp += gridDim.x) {
    const Level l = group_level<kSawb>(a, ws, grp, g.parts, smem);
    if (threadIdx.x == 0) {
      ws.m[grp] = l.m;
      ws.r[grp] = l.r;
      a.scale[grp] = l.s;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) absmax_kernel(float* out, const T* x, int64_t numel) {
  float m = 0.0f;
  for (int64_t i = thread_index(); i < numel; i += thread_count()) m = fmaxf(m, fabsf(static_cast<float>(x[i])));
  fold_absmax(out, m);
}

template <class T>
__global__ void __launch_bounds__(kThreads) hadamard_unit_kernel(float* out, const T* x, int64_t units, int unit,
                                                                 bool vec, int t) {
  for (int64_t u = thread_index(); u < units; u += thread_count()) {
    const int64_t base = u * unit;
    float v[kU];
    load_unit(x, base, unit, vec, v);
    rotate_unit(v, t);
    if (vec) {
      float4* o = reinterpret_cast<float4*>(out + base);
#pragma unroll
      for (int i = 0; i < kU / 4; ++i) o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    } else {
#pragma unroll
      for (int k = 0; k < kU; ++k)
        if (k < unit) out[base + k] = v[k];
    }
  }
}

// One butterfly stage h (>= 16) in place over blocks aligned to multiples of 2h or more.
__global__ void __launch_bounds__(kThreads) hadamard_stage_kernel(float* out, int64_t numel, int64_t h) {
  for (int64_t p = thread_index(); p < numel / 2; p += thread_count()) {
    const int64_t j = (p / h) * 2 * h + p % h;
    const float a = out[j], b = out[j + h];
    out[j] = __fadd_rn(a, b);
    out[j + h] = __fsub_rn(a, b);
  }
}

__global__ void __launch_bounds__(kThreads) pack_int4_kernel(uint8_t* out, const int8_t* in, int64_t bytes) {
  for (int64_t k = thread_index(); k < bytes; k += thread_count())
    out[k] = static_cast<uint8_t>((static_cast<unsigned>(in[2 * k]) & 0xFu) |
                                  ((static_cast<unsigned>(in[2 * k + 1]) & 0xFu) << 4));
}

__global__ void __launch_bounds__(kThreads) unpack_int4_kernel(int8_t* out, const uint8_t* in, int64_t bytes) {
  for (int64_t k = thread_index(); k < bytes; k += thread_count()) {
    const uint8_t b = in[k];
    out[2 * k] = static_cast<int8_t>(static_cast<int8_t>(static_cast<uint8_t>(b << 4)) >> 4);
    out[2 * k + 1] = static_cast<int8_t>(static_cast<int8_t>(b) >> 4);
  }
}

// Whether the item kernels can store to a.values: one item is 8 code bytes (one 8-byte word) or 16 / 32 bytes
// of dequantised values (16-byte words).
bool item_values_aligned(const GradQuantArgs& a) {
  return reinterpret_cast<uintptr_t>(a.values) % (a.store == QuantStore::codes ? 8 : 16) == 0;
}

static_assert(sizeof(GradQuantArgs) == 128, "GradQuantArgs grew: the kernels' parameter block changes (see store)");

// The two-pass Workspace carved out of `base` (grad_quant_workspace_bytes bytes).
Workspace workspace_of(void* base, const Geo& g) {
  const int64_t np = g.groups * g.parts;
  auto* d = static_cast<double*>(base);
  auto* f = reinterpret_cast<float*>(d + 2 * np);
  return {d, d + np, f, f + np, f + np + g.groups};
}

// The team of a fused launch for `need` threads per group: a power of two inside one warp (at least `least`), or
// whole warps above 32; then the teams per block (whole warps, at most the groups).
void size_teams(Geo& g, int64_t need, int least) {
  int team = least;
  while (team < need && team < 32) team *= 2;
  if (need > 32) team = static_cast<int>((need + 31) / 32 * 32);
  g.team = team;
  g.teams = team >= kFusedBlock ? 1 : kFusedBlock / team;
  if (g.teams > g.groups) g.teams = static_cast<int>(g.groups < 1 ? 1 : g.groups);
  while (g.team * g.teams % 32 != 0) ++g.teams;  // team < 32 divides 32
}

Geo plan(const GradQuantArgs& a) {
  Geo g;
  // The item path (fused, see quant_items_kernel) when its alignment holds, for the groups that the unit
  // path below would fuse (at most 16384 elements, and enough groups or short ones).
  g.items = a.kind == QuantKind::uniform && a.group_len % kItem == 0 && a.group_len <= 16384 &&
            (a.numel / a.group_len >= 66 || a.group_len <= 2048) && aligned16(a.x) && item_values_aligned(a) &&
            !a.transposed && a.known_m == nullptr;
  if (g.items) {
    g.fused = true;
    g.unit = kItem;
    g.vec = true;
    g.groups = a.numel / a.group_len;
    g.units = a.group_len / kItem;
    // Note [Item slots]: threads for kItemSlots items each, or kItemSlotsWide where that team costs less; T = 16
    // pairs neighbouring lanes.
    const int least = a.hadamard > kItem ? 2 : 1;
    size_teams(g, (g.units + kItemSlots - 1) / kItemSlots, least);
    if (!a.sawb && a.store == QuantStore::codes) {
      Geo w = g;
      w.slots = kItemSlotsWide;
      size_teams(w, (g.units + kItemSlotsWide - 1) / kItemSlotsWide, least);
      // a group's cost in item-equivalents per thread: its slots (empty ones run the butterflies too) plus the
      // per-group work (team reduction, the level's division, addresses), about one and a half items
      if (w.team * (2 * kItemSlotsWide + 3) < g.team * (2 * kItemSlots + 3)) g = w;
      // 4 items a thread (64 registers) where that team costs less by the same count, or where the team would
      // exceed 512 threads (rows above 12288 elements): such a team is one block of its group, and at 56 registers
      // only one such block fits an SM, whose warps then all wait at the team's reduction together; 4 slots keep
      // it within 512 threads, two blocks per SM (Note [Item slots]).
      Geo l = g;
      l.slots = kItemSlotsLong;
      size_teams(l, (g.units + kItemSlotsLong - 1) / kItemSlotsLong, least);
      if ((g.team > 512 && l.team <= 512) || l.team * (2 * kItemSlotsLong + 3) < g.team * (2 * g.slots + 3)) g = l;
    }
    return g;
  }
  g.unit = a.group_len % kU == 0 ? kU : a.hadamard;
  g.vec = g.unit == kU && aligned16(a.x) && aligned16(a.values);
  g.groups = a.numel / a.group_len;
  g.units = a.group_len / g.unit;
  // Fused when a group fits the registers of one team and there are enough groups (or little work).
  g.fused = g.units <= static_cast<int64_t>(kFusedUnits) * kFusedTeam && (g.groups >= 66 || g.units <= 128) &&
            !a.transposed && a.known_m == nullptr;
  if (g.fused) {
    size_teams(g, (g.units + kFusedUnits - 1) / kFusedUnits, 1);  // threads for kFusedUnits units each
  } else {
    // Blocks per group of the partial kernel: the count whose groups · parts blocks fill whole waves of
    // resident blocks best (132 SMs × 6 blocks of 256 threads at <= 40 registers, 5 for SAWB), at most
    // 4 waves, at least one unit per thread. A last wave of a few blocks would leave the GPU mostly idle.
    const int64_t wave = 132 * (a.sawb ? 5 : 6);
    const int64_t most = (g.units + kThreads - 1) / kThreads;
    g.parts = 1;
    double best = 0.0;
    for (int64_t p = 1; p <= most && (p == 1 || p * g.groups <= 4 * wave); ++p) {
      const int64_t blocks = p * g.groups;
      const double fill = static_cast<double>(blocks) / static_cast<double>((blocks + wave - 1) / wave * wave);
      if (fill > best + 1e-9) {
        best = fill;
        g.parts = p;
      }
    }
  }
  return g;
}

}  // namespace
}  // namespace ht::kernels::gq

namespace ht::kernels {

namespace {

// Bytes of gq::workspace_of's Workspace for g: per (group, part) two double sums and a maximum, per group m and r.
std::size_t workspace_bytes_of(const gq::Geo& g) {
  const int64_t np = g.groups * g.parts;
  return static_cast<std::size_t>(np) * (2 * sizeof(double) + sizeof(float)) +
         static_cast<std::size_t>(g.groups) * 2 * sizeof(float);
}

// Bytes of the two-pass statistics (0 on the fused path or with a known m).
std::size_t stats_bytes(const GradQuantArgs& args) {
  const gq::Geo g = gq::plan(args);
  if (g.fused || args.known_m != nullptr) return 0;  // a known m needs no pass-2 workspace
  return workspace_bytes_of(g);
}

// Where the strip kernel's column partials start in the workspace: after the statistics, 32-byte aligned (the
// kernel stores them as pairs of float4).
std::size_t sums_offset(const GradQuantArgs& args) { return (stats_bytes(args) + 31) / 32 * 32; }

}  // namespace

bool grad_quant_sums_in_pass(const GradQuantArgs& args) {
  return args.kind == QuantKind::uniform && args.transposed && args.numel > 0 && gq::strips_apply(args);
}

std::size_t grad_quant_workspace_bytes(const GradQuantArgs& args, bool with_sums) {
  if (args.numel == 0) return 0;
  if (!with_sums) return stats_bytes(args);
  const int64_t strips_n = (args.numel / args.cols + gq::kStripRows - 1) / gq::kStripRows;
  return sums_offset(args) + static_cast<std::size_t>(strips_n * args.cols) * sizeof(float);
}

void launch_grad_quant(const GradQuantArgs& a, cudaStream_t stream, float* column_sums) {
  if (a.numel == 0) return;
  const bool luq = a.kind == QuantKind::luq;
  if (a.store != QuantStore::codes && (luq || a.transposed))  // quantize() rejects these: a hadatrain bug
    HT_UNSUPPORTED_DTYPE("grad_quant (dequantised values need the uniform kind and the natural layout)", a.dtype);
  const gq::Geo g = gq::plan(a);
  if (g.items) return gq::launch_fused_items(a, g, stream);
  if (g.fused) return gq::launch_fused_units(a, g, stream);
  // Two passes: the group statistics (passes 1 and 2, or the known m), then the quantisation (pass 3).
  gq::Workspace ws = a.workspace != nullptr ? gq::workspace_of(a.workspace, g) : gq::Workspace{};
  const bool item_x = a.group_len % gq::kItem == 0 && gq::aligned16(a.x);  // passes 1 and 3 on items
  if (a.known_m != nullptr) {  // one group with a given m: pass 3 computes its level (Note [Known m in pass 3])
    // No pass reads x before the quantisation: a separate maximum.
    if (a.input_absmax) launch_absmax(a.dtype, a.input_absmax, a.x, a.numel, stream);
  } else {
    if (item_x) gq::launch_partial_items(a, g, ws, stream);
    else gq::launch_partial_units(a, g, ws, stream);
    if (g.groups == 1) {
      ws.fold_parts = g.parts;  // pass 3 folds them (Note [Pass 2 in pass 3])
    } else {
      const unsigned grid = gq::grid_cap(g.groups);
      if (gq::uses_sawb(a)) gq::quant_finalize_kernel<true><<<grid, gq::kThreads, 0, stream>>>(a, g, ws);
      else gq::quant_finalize_kernel<false><<<grid, gq::kThreads, 0, stream>>>(a, g, ws);
      HT_CHECK_LAUNCH("grad_quant_finalize");
    }
  }
  if (a.transposed) {
    if (column_sums != nullptr && (a.workspace == nullptr || !grad_quant_sums_in_pass(a)))  // a hadatrain bug
      HT_UNSUPPORTED_DTYPE("grad_quant (column sums need a strip-kernel launch and its workspace)", a.dtype);
    float* part = column_sums != nullptr
                      ? reinterpret_cast<float*>(static_cast<uint8_t*>(a.workspace) + sums_offset(a))
                      : nullptr;
    return gq::launch_apply_transposed(a, ws, part, column_sums, stream);
  }
  if (item_x && !luq && gq::item_values_aligned(a)) return gq::launch_apply_items(a, ws, stream);
  gq::launch_apply_units(a, g, ws, stream);
}

namespace {

// The two-pass geometry of a transposed-input launch: one group, pass 1 on about two tiles a thread, at most 8
// blocks per SM of the H200 (parts only sets how many partial statistics pass 2 combines).
gq::Geo transpose_geo(int64_t R, int64_t C) {
  gq::Geo g;
  g.groups = 1;
  const int64_t tiles = R / 16 * (C / gq::kWtCols), per_block = 2 * gq::kThreads;
  g.parts = std::clamp<int64_t>((tiles + per_block - 1) / per_block, 1, 132 * 8);
  return g;
}

}  // namespace

bool grad_quant_of_transpose_applies(const GradQuantArgs& a, int64_t R, int64_t C) {
  return a.kind == QuantKind::uniform && a.hadamard == 16 && a.numel == R * C && a.numel > 0 &&
         a.group_len == a.numel && a.store == QuantStore::codes && !a.transposed && a.known_m == nullptr &&
         a.input_absmax == nullptr && (a.dtype == DType::bf16 || a.dtype == DType::f16) && R % 16 == 0 &&
         C % 8 == 0 && gq::aligned16(a.x) && gq::aligned16(a.values);
}

std::size_t grad_quant_of_transpose_workspace_bytes(int64_t R, int64_t C) {
  return workspace_bytes_of(transpose_geo(R, C));
}

namespace {
constinit LaunchCounter g_transpose_launches;  // grad_quant_of_transpose_launches()
}  // namespace

int64_t grad_quant_of_transpose_launches() { return g_transpose_launches.get(); }

void launch_grad_quant_of_transpose(const GradQuantArgs& a, int64_t R, int64_t C, cudaStream_t stream) {
  g_transpose_launches.add();
  if (!grad_quant_of_transpose_applies(a, R, C) || a.workspace == nullptr)  // the glue checks: a hadatrain bug
    HT_UNSUPPORTED_DTYPE("grad_quant (transposed input outside its conditions)", a.dtype);
  const gq::Geo g = transpose_geo(R, C);
  gq::Workspace ws = gq::workspace_of(a.workspace, g);
  gq::launch_partial_wt(a, g, ws, R, C, stream);
  ws.fold_parts = g.parts;  // pass 3 folds them (Note [Pass 2 in pass 3])
  gq::launch_apply_wt(a, ws, R, C, stream);
}

void launch_absmax(DType dtype, float* out, const void* x, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  gq::visit_quant_dtype(dtype, "absmax", [&](auto tag) {
    using T = decltype(tag);
    gq::absmax_kernel<T><<<cuda::grid_for(numel, gq::kThreads), gq::kThreads, 0, stream>>>(
        out, static_cast<const T*>(x), numel);
    HT_CHECK_LAUNCH("absmax");
  });
}

void launch_hadamard_blocks(DType dtype, float* out, const void* x, int64_t numel, int64_t block,
                            cudaStream_t stream) {
  if (numel == 0) return;
  const int unit = numel % gq::kU == 0 ? gq::kU : static_cast<int>(block);  // block <= 8 when numel % 16 != 0
  const bool vec = unit == gq::kU && gq::aligned16(x) && gq::aligned16(out);
  const int t = static_cast<int>(block < gq::kU ? block : gq::kU);
  const int64_t units = numel / unit;
  gq::visit_quant_dtype(dtype, "hadamard_blocks", [&](auto tag) {
    using T = decltype(tag);
    gq::hadamard_unit_kernel<T><<<cuda::grid_for(units, gq::kThreads), gq::kThreads, 0, stream>>>(
        out, static_cast<const T*>(x), units, unit, vec, t);
    HT_CHECK_LAUNCH("hadamard_blocks");
  });
  for (int64_t h = gq::kU; h < block; h *= 2) {
    gq::hadamard_stage_kernel<<<cuda::grid_for(numel / 2, gq::kThreads), gq::kThreads, 0, stream>>>(out, numel, h);
    HT_CHECK_LAUNCH("hadamard_stage");
  }
}

void launch_pack_int4(uint8_t* out, const int8_t* in, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  gq::pack_int4_kernel<<<cuda::grid_for(numel / 2, gq::kThreads), gq::kThreads, 0, stream>>>(out, in, numel / 2);
  HT_CHECK_LAUNCH("pack_int4");
}

void launch_unpack_int4(int8_t* out, const uint8_t* in, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  gq::unpack_int4_kernel<<<cuda::grid_for(numel / 2, gq::kThreads), gq::kThreads, 0, stream>>>(out, in, numel / 2);
  HT_CHECK_LAUNCH("unpack_int4");
}

}  // namespace ht::kernels
