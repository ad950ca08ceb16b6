// Launchers of copies: dtype-converting strided copy (every dtype but packed int4, with the CPU's
// conversion rules bit for bit, Note [Narrow-float conversion]) and fill.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"
#include "cuda/kernels/kernel_layout.h"

namespace ht::kernels {

struct CopyArgs {
  DType dst_dtype;
  DType src_dtype;
  void* dst;
  const void* src;
  Layout<2> layout;  // dst, src (src may broadcast: stride 0)
};

// dst[i] = convert(src[i]). Same-dtype copies move bits; converting copies go through double, which gives
// exactly the CPU's results for every pair (see copy.cu).
void launch_copy(const CopyArgs& args, cudaStream_t stream);

// Every element of dst (elements of `itemsize` bytes, any strides) gets the bit pattern `bits` (low bytes).
void launch_fill(std::size_t itemsize, uint64_t bits, void* dst, const Layout<1>& layout, cudaStream_t stream);

}  // namespace ht::kernels
