// Batch-norm elementwise kernels on the split grids (batchnorm_launch.cuh): normalize (y = act(x * scale +
// shift)) and dx, channels last (bn_*_cl) and channels first (bn_*_cf, with 16-byte stores: Note [Batch-norm
// 16-byte stores] in batchnorm_common.cuh). Each block walks its range backwards (walk) to first
// read what the reduction before it read last.
#include "cuda/kernels/batchnorm_common.cuh"

namespace ht::kernels::bn {
namespace {

// ---- normalize ------------------------------------------------------------------------------------------

template <BnAct Act, class T, int V>
HT_DEV void bn_normalize_cl_body(const T* __restrict__ x, int64_t M, int64_t C, ClGrid g, BnChannels ch,
                                T* __restrict__ y) {
  using A = bn_t<T>;
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cv >= g.CV) return;
  A sc[V], sh[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    double a, b;
    affine_of(ch, cv * V + j, a, b);
    sc[j] = static_cast<A>(a);
    sh[j] = static_cast<A>(b);
  }
  const int TY = blockDim.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.rows_per_block;
  const int64_t r1 = std::min(M, r0 + g.rows_per_block);
  const T* xc = x + cv * V;
  T* yc = y + cv * V;
  walk(
      r0, r0 + threadIdx.y, r1, TY,
      [&](int64_t r, int64_t q2) {
        const Pack<T, V> p = load_pack<T, V>(xc + r * C), q = load_pack<T, V>(xc + q2 * C);
        const Pack<T, V> rp = load_res<Act, T, V>(ch, cv * V + r * C), rq = load_res<Act, T, V>(ch, cv * V + q2 * C);
        Pack<T, V> o, u;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          o.v[j] = bn_out<Act, T>(convert<A>(p.v[j]), sc[j], sh[j], rp.v[j]);
          u.v[j] = bn_out<Act, T>(convert<A>(q.v[j]), sc[j], sh[j], rq.v[j]);
        }
        store_pack<T, V>(yc + r * C, o);
        store_pack<T, V>(yc + q2 * C, u);
      },
      [&](int64_t r) {
        const Pack<T, V> p = load_pack<T, V>(xc + r * C), rp = load_res<Act, T, V>(ch, cv * V + r * C);
        Pack<T, V> o;
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = bn_out<Act, T>(convert<A>(p.v[j]), sc[j], sh[j], rp.v[j]);
        store_pack<T, V>(yc + r * C, o);
      });
}
// Compiled for 4 resident blocks per SM (its grid: one wave of them, cl_grid's kTargetBlocksCl).
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, 4)
    bn_normalize_cl(const T* __restrict__ x, int64_t M, int64_t C, ClGrid g, BnChannels ch, T* __restrict__ y) {
  bn_normalize_cl_body<Act, T, V>(x, M, C, g, ch, y);
}

template <BnAct Act, class T, int V, bool VS>
HT_DEV void bn_normalize_cf_body(const T* __restrict__ x, BnShape s, CfGrid g, BnChannels ch, T* __restrict__ y) {
  using A = bn_t<T>;
  const int64_t c = blockIdx.x;
  double a, b;
  affine_of(ch, c, a, b);
  const A sc = static_cast<A>(a), sh = static_cast<A>(b);
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * g.chunk, j1 = std::min(g.per_channel, j0 + g.chunk);
  walk(
      j0, j0 + threadIdx.x, j1, kThreads,
      [&](int64_t ja, int64_t jb) {
        const int64_t o0 = cf_offset(s, g, c, ja, V), o1 = cf_offset(s, g, c, jb, V);
        const Pack<T, V> p = load_pack<T, V>(x + o0), q = load_pack<T, V>(x + o1);
        const Pack<T, V> rp = load_res<Act, T, V>(ch, o0), rq = load_res<Act, T, V>(ch, o1);
        Pack<T, V> o, u;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          o.v[k] = bn_out<Act, T>(convert<A>(p.v[k]), sc, sh, rp.v[k]);
          u.v[k] = bn_out<Act, T>(convert<A>(q.v[k]), sc, sh, rq.v[k]);
        }
        cf_store<VS, T, V>(y + o0, o);
        cf_store<VS, T, V>(y + o1, u);
      },
      [&](int64_t ja) {
        const int64_t o0 = cf_offset(s, g, c, ja, V);
        const Pack<T, V> p = load_pack<T, V>(x + o0), rp = load_res<Act, T, V>(ch, o0);
        Pack<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = bn_out<Act, T>(convert<A>(p.v[k]), sc, sh, rp.v[k]);
        cf_store<VS, T, V>(y + o0, o);
      });
}
// Compiled for 8 resident blocks per SM; 16-byte stores (Note [Batch-norm 16-byte stores]).
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, 8)
    bn_normalize_cf(const T* __restrict__ x, BnShape s, CfGrid g, BnChannels ch, T* __restrict__ y) {
  bn_normalize_cf_body<Act, T, V, true>(x, s, g, ch, y);
}

// ---- dx -------------------------------------------------------------------------------------------------

// Two element offsets o0, o1 (pair) or one (single) of dx: loads, dx_elem, stores.
template <BnAct Act, class T, int V, class A, bool VS = false>
struct DxPacks {
  BnMode mode;
  bool read_x;
  const T* __restrict__ gr;
  const T* __restrict__ x;
  T* __restrict__ gx;
  const BnChannels& ch;
  HT_DEV void pair(int64_t o0, int64_t o1, const A* ca, const A* cb, const A* ck, const A* cm, const A* sc,
                   const A* sh, int cs /* 1: per-element constants (channels last), 0: one set */) const {
    const Pack<T, V> g0 = load_pack<T, V>(gr + o0), g1 = load_pack<T, V>(gr + o1);
    const Pack<T, V> q0 = load_res<Act, T, V>(ch, o0), q1 = load_res<Act, T, V>(ch, o1);
    Pack<T, V> x0{}, x1{};
    if (read_x) {
      x0 = load_pack<T, V>(x + o0);
      x1 = load_pack<T, V>(x + o1);
    }
    Pack<T, V> y0, y1, e0, e1;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int k = j * cs;
      dx_elem<Act, T, A>(mode, g0.v[j], x0.v[j], q0.v[j], ca[k], cb[k], ck[k], cm[k], sc[k], sh[k], y0.v[j], e0.v[j]);
      dx_elem<Act, T, A>(mode, g1.v[j], x1.v[j], q1.v[j], ca[k], cb[k], ck[k], cm[k], sc[k], sh[k], y1.v[j], e1.v[j]);
    }
    cf_store<VS, T, V>(gx + o0, y0);
    cf_store<VS, T, V>(gx + o1, y1);
    store_res_grad<Act, T, V, VS>(ch, o0, e0);
    store_res_grad<Act, T, V, VS>(ch, o1, e1);
  }
  HT_DEV void single(int64_t o0, const A* ca, const A* cb, const A* ck, const A* cm, const A* sc, const A* sh,
                     int cs) const {
    const Pack<T, V> g0 = load_pack<T, V>(gr + o0), q0 = load_res<Act, T, V>(ch, o0);
    Pack<T, V> x0{};
    if (read_x) x0 = load_pack<T, V>(x + o0);
    Pack<T, V> y0, e0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int k = j * cs;
      dx_elem<Act, T, A>(mode, g0.v[j], x0.v[j], q0.v[j], ca[k], cb[k], ck[k], cm[k], sc[k], sh[k], y0.v[j], e0.v[j]);
    }
    cf_store<VS, T, V>(gx + o0, y0);
    store_res_grad<Act, T, V, VS>(ch, o0, e0);
  }
};

// x is read in train mode and whenever Act masks g; otherwise it may be null.
template <BnAct Act, class T, int V>
HT_DEV void bn_dx_cl_body(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, int64_t M, int64_t C,
                         ClGrid g, BnChannels ch, const double* __restrict__ sum_g,
                         const double* __restrict__ sum_gxhat, T* __restrict__ gx) {
  using A = bn_t<T>;
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cv >= g.CV) return;
  const int64_t col = cv * V;
  const double inv_m = 1.0 / static_cast<double>(M);
  A ca[V], cb[V], ck[V], cm[V], sc[V], sh[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const DxCoef d = dx_coef_of(mode, ch, sum_g, sum_gxhat, inv_m, col + j);
    ca[j] = static_cast<A>(d.a);
    cb[j] = static_cast<A>(d.b);
    ck[j] = static_cast<A>(d.k);
    cm[j] = static_cast<A>(d.m);
    sc[j] = sh[j] = A(0);
    if constexpr (Act != BnAct::none) {
      double a, b;
      affine_of(ch, col + j, a, b);
      sc[j] = static_cast<A>(a);
      sh[j] = static_cast<A>(b);
    }
  }
  const DxPacks<Act, T, V, A> d{mode, mode == BnMode::train || Act != BnAct::none, gr, x, gx, ch};
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.rows_per_block;
  const int64_t r1 = std::min(M, r0 + g.rows_per_block);
  walk(
      r0, r0 + threadIdx.y, r1, blockDim.y,
      [&](int64_t ra, int64_t rb) { d.pair(col + ra * C, col + rb * C, ca, cb, ck, cm, sc, sh, 1); },
      [&](int64_t ra) { d.single(col + ra * C, ca, cb, ck, cm, sc, sh, 1); });
}
// Compiled for 3 resident blocks per SM (its grid: one wave of them, kTargetBlocksClDx).
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, 3)
    bn_dx_cl(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, int64_t M, int64_t C, ClGrid g,
                BnChannels ch, const double* __restrict__ sum_g, const double* __restrict__ sum_gxhat,
                T* __restrict__ gx) {
  bn_dx_cl_body<Act, T, V>(mode, gr, x, M, C, g, ch, sum_g, sum_gxhat, gx);
}

template <BnAct Act, class T, int V, bool VS>
HT_DEV void bn_dx_cf_body(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, BnShape s, CfGrid g,
                          BnChannels ch, const double* __restrict__ sum_g, const double* __restrict__ sum_gxhat,
                          T* __restrict__ gx) {
  using A = bn_t<T>;
  const int64_t c = blockIdx.x;
  const DxCoef dc = dx_coef_of(mode, ch, sum_g, sum_gxhat, 1.0 / static_cast<double>(s.N * s.S), c);
  const A ca = static_cast<A>(dc.a), cb = static_cast<A>(dc.b), ck = static_cast<A>(dc.k), cm = static_cast<A>(dc.m);
  A sc = A(0), sh = A(0);
  if constexpr (Act != BnAct::none) {
    double a, b;
    affine_of(ch, c, a, b);
    sc = static_cast<A>(a);
    sh = static_cast<A>(b);
  }
  const DxPacks<Act, T, V, A, VS> d{mode, mode == BnMode::train || Act != BnAct::none, gr, x, gx, ch};
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * g.chunk, j1 = std::min(g.per_channel, j0 + g.chunk);
  walk(
      j0, j0 + threadIdx.x, j1, kThreads,
      [&](int64_t ja, int64_t jb) {
        d.pair(cf_offset(s, g, c, ja, V), cf_offset(s, g, c, jb, V), &ca, &cb, &ck, &cm, &sc, &sh, 0);
      },
      [&](int64_t ja) { d.single(cf_offset(s, g, c, ja, V), &ca, &cb, &ck, &cm, &sc, &sh, 0); });
}
// Compiled for 8 (6 with a fused activation) resident blocks per SM; 16-byte stores (Note [Batch-norm 16-byte
// stores]).
template <BnAct Act, class T, int V>
__global__ void __launch_bounds__(kThreads, (Act == BnAct::none ? 8 : 6))
    bn_dx_cf(BnMode mode, const T* __restrict__ gr, const T* __restrict__ x, BnShape s, CfGrid g, BnChannels ch,
                const double* __restrict__ sum_g, const double* __restrict__ sum_gxhat, T* __restrict__ gx) {
  bn_dx_cf_body<Act, T, V, true>(mode, gr, x, s, g, ch, sum_g, sum_gxhat, gx);
}

}  // namespace

void normalize_split(const NormalizeArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const BnChannels& ch = a.ch;
  const int64_t M = s.N * s.S;
  visit_bn_act(a.dt, s, {a.x, a.y, ch.residual}, ch.act, [&](auto tag, auto vtag, auto atag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr BnAct Act = decltype(atag)::value;
    const T* xp = static_cast<const T*>(a.x);
    T* yp = static_cast<T*>(a.y);
    if (s.S == 1) {
      const ClGrid g = cl_grid(M, s.C, V, kTargetBlocksCl);
      bn_normalize_cl<Act, T, V><<<g.grid, g.block, 0, stream>>>(xp, M, s.C, g, ch, yp);
    } else {
      const CfGrid g = cf_grid(s, V);
      bn_normalize_cf<Act, T, V><<<g.grid, kThreads, 0, stream>>>(xp, s, g, ch, yp);
    }
  });
}

void dx_split(const DxArgs& a, cudaStream_t stream) {
  const BnShape s = a.s;
  const BnChannels& ch = a.ch;
  const BnMode mode = a.mode;
  const double* sum_g = a.sum_g;
  const double* sum_gxhat = a.sum_gxhat;
  const int64_t M = s.N * s.S;
  visit_bn_act(a.dt, s, {a.g, a.x, a.gx, ch.residual, ch.residual_grad}, ch.act, [&](auto tag, auto vtag, auto atag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr BnAct Act = decltype(atag)::value;
    const T* gp = static_cast<const T*>(a.g);
    const T* xp = static_cast<const T*>(a.x);
    T* out = static_cast<T*>(a.gx);
    if (s.S == 1) {
      const ClGrid cg = cl_grid(M, s.C, V, kTargetBlocksClDx);
      bn_dx_cl<Act, T, V><<<cg.grid, cg.block, 0, stream>>>(mode, gp, xp, M, s.C, cg, ch, sum_g, sum_gxhat, out);
    } else {
      const CfGrid cg = cf_grid(s, V);
      bn_dx_cf<Act, T, V><<<cg.grid, kThreads, 0, stream>>>(mode, gp, xp, s, cg, ch, sum_g, sum_gxhat, out);
    }
  });
}

}  // namespace ht::kernels::bn
