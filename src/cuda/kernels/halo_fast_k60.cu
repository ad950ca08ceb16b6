// HALO's fast row kernels for rotation order K = 60 (Note [HALO fast rows] in halo_fast.cu).
#include "cuda/kernels/halo_fast_rows_impl.cuh"

template void ht::kernels::halo_fast::rows::run<60>(Mode, bool, const HaloRowsArgs&, const HaloSigns&, const Out&,
                                                    cudaStream_t);
