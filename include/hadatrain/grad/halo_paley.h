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
