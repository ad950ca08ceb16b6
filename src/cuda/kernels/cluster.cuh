// Thread block clusters (sm_90): the block's rank and the cluster's size, the cluster-wide barrier and the address
// of this block's shared memory in another block of the cluster (distributed shared memory). A launch without a
// cluster dimension is a cluster of one block; builds for older architectures get those one-block meanings. Used by
// the norm backward's cluster kernel (rows_norm_staged_bwd.cu) and HALO's column kernels (halo_columns.cu).
// Internal to src/cuda/kernels.
#pragma once
#include "cuda/kernels/kernel_layout.h"

namespace ht::kernels {

HT_DEV unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return __clusterRelativeBlockRank();
#else
  return 0;
#endif
}
HT_DEV unsigned cluster_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return __clusterSizeInBlocks();
#else
  return 1;
#endif
}
// Every thread of every block of the cluster; shared-memory writes before it are visible cluster-wide after.
HT_DEV void cluster_sync_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive();
  __cluster_barrier_wait();
#else
  __syncthreads();
#endif
}
// The address of p (this block's shared memory) in block `rank` of the cluster.
template <class A>
HT_DEV const A* cluster_peer(const A* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<const A*>(__cluster_map_shared_rank(p, rank));
#else
  (void)rank;
  return p;
#endif
}

}  // namespace ht::kernels
