// Fuzz target: the CIFAR binary reader (data/cifar.h) on one file as CIFAR-10 and as CIFAR-100 (fine and
// coarse labels), then each record as an image. Input: the file's bytes.
#include <cstddef>
#include <cstdint>

#include "hadatrain/core/error.h"
#include "hadatrain/data/cifar.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace ht::data;
  const auto path = ht::fuzz::write_input("input.bin", data, size);
  for (const auto& [variant, label] : {std::pair{CifarVariant::cifar10, CifarLabel::fine},
                                       std::pair{CifarVariant::cifar100, CifarLabel::fine},
                                       std::pair{CifarVariant::cifar100, CifarLabel::coarse}}) {
    try {
      const CifarData d = read_cifar_file(path, {.variant = variant, .label = label});
      for (int64_t i = 0; i < d.size(); ++i) (void)d.image(i);
    } catch (const ht::Error&) {
    }
  }
  return 0;
}
