// HALO's fast row kernels for rotation order K = 1 (Note [HALO fast rows] in halo_fast.cu).
#include "cuda/kernels/halo_fast_rows_impl.cuh"

template void ht::kernels::halo_fast::rows::run<1>(Mode, bool, const HaloRowsArgs&, const HaloSigns&, const Out&,
                                                    cudaStream_t);
