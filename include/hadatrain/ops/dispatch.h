// Device dispatch helpers shared by every op file.
#pragma once
#include <initializer_list>

#include "hadatrain/tensor/tensor.h"

namespace ht {

// The device all defined tensors share; throws naming the op and the devices when they differ.
Device common_device(const char* op, std::initializer_list<const Tensor*> tensors);
// Thrown from the CUDA branch of an op that has no CUDA implementation in this build: says "built without
// CUDA" in a CPU-only build, and "no CUDA kernel for <op> yet" otherwise.
[[noreturn]] void no_cuda_kernel(const char* op);
// Throws unless every defined tensor is of a floating dtype.
void check_floating(const char* op, std::initializer_list<const Tensor*> tensors);

}  // namespace ht
