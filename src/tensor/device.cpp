// Device names and CUDA availability queries.
#include "hadatrain/tensor/device.h"

#include "hadatrain/core/error.h"
#include "hadatrain/tensor/cuda_hooks.h"

namespace ht {

std::string to_string(Device d) { return d.is_cpu() ? "cpu" : "cuda:" + std::to_string(d.index); }

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    HT_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos,
             "bad device '{}': expected cpu, cuda or cuda:N", s);
    return Device::cuda(std::stoi(idx));
  }
  HT_FAIL("bad device '{}': expected cpu, cuda or cuda:N", s);
}

bool built_with_cuda() {
#ifdef HADATRAIN_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() { return cuda_hooks() ? cuda_hooks()->device_count() : 0; }

}  // namespace ht
