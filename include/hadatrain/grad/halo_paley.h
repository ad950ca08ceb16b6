// The K×K Hadamard matrices of HALO's rotations (Note [HALO rotations], grad/pipeline_halo.h), computed at compile
// time: halo_paley_signs<K>()[i] holds row i of H_K as sign bits (bit j set: H_K[i][j] = −1), for K = 1 and the
// Paley orders 12, 20, 28, 36, 44, 60: the one definition behind halo_hadamard_signs, which the CPU reference
// uses and the CUDA launchers hand to their kernels (HaloSigns).
#pragma once
#include <array>
#include <cstdint>

namespace ht::grad::paley {

constexpr bool is_prime(int q) {
  for (int d = 2; d * d <= q; ++d)
    if (q % d == 0) return false;
  return q >= 2;
}

inline constexpr int kMax = 60;
using Matrix = std::array<std::array<int, kMax>, kMax>;

// The (q+1)×(q+1) core of Paley's constructions: S[0][0] = 0, S[0][j] = 1, S[i][0] = first_column (−1 for type I,
// +1 for type II), and S[i][j] = χ(j − i) for i, j >= 1, χ the quadratic character mod q.
constexpr Matrix core(int q, int first_column) {
  std::array<int, kMax> chi{};
  for (int a = 0; a < q; ++a) chi[a] = -1;
  chi[0] = 0;
  for (int a = 1; a < q; ++a) chi[(a * a) % q] = 1;
  Matrix s{};
  for (int j = 1; j <= q; ++j) {
    s[0][j] = 1;
    s[j][0] = first_column;
  }
  for (int i = 1; i <= q; ++i)
    for (int j = 1; j <= q; ++j) s[i][j] = chi[((j - i) % q + q) % q];
  return s;
}

// H_K by Paley's construction I (K − 1 prime ≡ 3 mod 4: H = I + S, S skew) or II (K/2 − 1 prime ≡ 1 mod 4: S
// symmetric, each entry replaced by a 2×2 block); entries ±1. An order with neither gives a zero matrix, which
// is_hadamard rejects.
constexpr Matrix matrix(int k) {
  Matrix h{};
  if (is_prime(k - 1) && (k - 1) % 4 == 3) {
    h = core(k - 1, -1);
    for (int i = 0; i < k; ++i) h[i][i] = 1;
  } else if (const int q = k / 2 - 1; k % 2 == 0 && is_prime(q) && q % 4 == 1) {
    const Matrix s = core(q, 1);
    for (int i = 0; i <= q; ++i)
      for (int j = 0; j <= q; ++j) {
        const int e = s[i][j];
        h[2 * i][2 * j] = e == 0 ? 1 : e;
        h[2 * i][2 * j + 1] = e == 0 ? -1 : e;
        h[2 * i + 1][2 * j] = e == 0 ? -1 : e;
        h[2 * i + 1][2 * j + 1] = e == 0 ? -1 : -e;
      }
  }
  return h;
}

// Note [HALO paired K×K stage]
// Paley's construction II builds H_K (K = 2(q + 1): 28 and 36 here) from the symmetric (q+1)×(q+1) core S by
// blocks: H_K = S ⊗ B + I ⊗ D with B = [[1, 1], [1, −1]] and D = [[1, −1], [−1, −1]] (S's diagonal is 0). H_K is
// then symmetric, so v·H_K and v·H_Kᵀ are the same, and with the pair sums and differences p_i = u_2i + u_2i+1
// and m_i = u_2i − u_2i+1 of a column u (i < K/2), its outputs are
//   out_2j     = Σ_i t_i,  t_j = m_j,   t_i = S_ij·p_i (i ≠ j)
//   out_2j+1   = Σ_i t'_i, t'_j = −p_j, t'_i = S_ij·m_i (i ≠ j)
// with S_ij = H_K[2i][2j] = H_K[2i][2j + 1]. The K×K stage of those orders is computed so: the K/2 pair sums and
// differences first, then each output as its K/2 terms summed in i order in f32, starting from t_0 itself (the
// other orders start from 0.0f and add ±u_k, K terms). K + K·(K/2 − 1) additions instead of K·K: 392 instead of
// 784 at K = 28. The CPU reference (grad/halo_quant.cpp) and every CUDA kernel use this order for these K, so their
// bits agree; pair_form(K) says which orders take it, and halo_hadamard_signs checks the block form of their tables.
constexpr bool pair_form(int k) {
  const int q = k / 2 - 1;
  return k % 2 == 0 && is_prime(q) && q % 4 == 1 && !(is_prime(k - 1) && (k - 1) % 4 == 3);
}
// Term i of output c (= 2j + odd) in that order: whether it is the pair sum p_i (else the difference m_i) and whether
// it is subtracted; row2i holds the signs of H_K's row 2i (bit c set: −1). The CPU reference and the folded CUDA
// kernels (halo_fast_rows_impl.cuh's PairTerm) take their terms from here; the runtime-sign kernel
// (paired_kk_column in cuda/kernels/halo_common.cuh) writes the same two selections inline.
struct PairTerm {
  bool sum, minus;
};
constexpr PairTerm pair_term(int i, int c, uint64_t row2i) {
  const bool odd = (c & 1) != 0, diag = i == c >> 1;
  return {diag == odd, diag ? odd : ((row2i >> c) & 1U) != 0};
}

// H·Hᵀ = k·I with every entry ±1.
constexpr bool is_hadamard(const Matrix& h, int k) {
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) {
      if (h[i][j] != 1 && h[i][j] != -1) return false;
      int dot = 0;
      for (int c = 0; c < k; ++c) dot += h[i][c] * h[j][c];
      if (dot != (i == j ? k : 0)) return false;
    }
  return true;
}

}  // namespace ht::grad::paley

namespace ht::grad {

template <int K>
constexpr std::array<uint64_t, K> halo_paley_signs() {
  std::array<uint64_t, K> rows{};
  if constexpr (K > 1) {
    // H·Hᵀ = K·I is checked where the table is first used on the host (halo_hadamard_signs), not here: for K = 60
    // the check exceeds compilers' constant-evaluation budgets.
    constexpr paley::Matrix h = paley::matrix(K);
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < K; ++j)
        if (h[i][j] < 0) rows[i] |= uint64_t{1} << j;
  }
  return rows;
}

}  // namespace ht::grad
