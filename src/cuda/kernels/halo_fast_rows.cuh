// What the entry points of halo_fast.cu hand to the row kernels of halo_fast_rows_impl.cuh: the pass (Mode), its
// outputs (Out) and rows::run<K>, one explicit instantiation per rotation order K in its own translation unit
// (halo_fast_k<K>.cu), so the orders compile in parallel and the K×K stage of each can have its signs folded into
// its instructions (Note [HALO folded K×K stage] in halo_fast_rows_impl.cuh). Internal to src/cuda/kernels.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/kernels/halo.cuh"

namespace ht::kernels::halo_fast::rows {

inline constexpr int kChunk = 512;   // values per warp in phase A: 32 lanes × 16; the least power-of-two part
inline constexpr int kMaxN = 32768;  // grad::kHaloMaxRotation

enum class Mode { rotate, absmax, quantize };

struct Out {
  // rotate: out (R, cols) of out_dtype, each value multiplied by mult
  void* out = nullptr;
  DType out_dtype = DType::f32;
  int cols = 0;
  float mult = 1.0f;
  float* absmax = nullptr;  // absmax: the device word to raise
  // quantize: codes (R, n), absmax m given, scale written by CTA 0
  uint8_t* codes = nullptr;
  bool int8 = true;
  const float* m = nullptr;
  float* scale = nullptr;
  // Note [HALO paired quantiser]: the unrotated values' absmax word (absmax mode), or their codes (R, C) for the
  // absmax m_plain and their scale (quantize mode); unused unless `pair`
  float* absmax_plain = nullptr;
  uint8_t* codes_plain = nullptr;
  const float* m_plain = nullptr;
  float* scale_plain = nullptr;
  // Note [HALO row prefetch]: rows are staged in shared memory after the rotated row (set by the launcher)
  bool staged = false;
};

// Launches the row kernel of pass `mode` (paired: Note [HALO paired quantiser]; absmax and quantize only) for rows
// a with a.k == K, on a.in_dtype (f32, bf16 or f16). Instantiated for K = 1, 12, 20, 28, 36, 44, 60.
template <int K>
void run(Mode mode, bool pair, const HaloRowsArgs& a, const HaloSigns& signs, const Out& o, cudaStream_t stream);

}  // namespace ht::kernels::halo_fast::rows
