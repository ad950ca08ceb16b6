// CPU-only builds: there is no CUDA backend behind the hooks.
#include "hadatrain/tensor/cuda_hooks.h"

#include "hadatrain/core/error.h"

namespace ht {
const CudaHooks* cuda_hooks() { return nullptr; }
const CudaHooks& require_cuda(const char* what) {
  HT_FAIL("{}: hadatrain was built without CUDA (reconfigure with a CUDA toolkit installed to use cuda devices)",
          what);
}
}  // namespace ht
