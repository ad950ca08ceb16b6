// Training-step benchmark (CUDA builds): ResNet-18/34 with the CIFAR stem on random 32x32 inputs, 100
// classes, SGD momentum 0.9, cross-entropy; forward in f32 or bf16 (f32 master weights). Median of 20 timed
// steps after 5 warm-up steps, CUDA events. Compare with tools/bench/bench_train_torch.py in the same run.
//   bench_train [resnet18|resnet34] [batch] [f32|bf16]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "hadatrain/cuda/allocator.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/cuda_hooks.h"

using namespace ht;

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "resnet18";
  const int64_t batch = argc > 2 ? std::stoll(argv[2]) : 256;
  const DType dt = (argc > 3 && std::string(argv[3]) == "f32") ? DType::f32 : DType::bf16;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const Device dev = Device::cuda(0);
  Generator gen(0);
  models::ResNet model({models::resnet_depth_from_name(name), models::ResNetStem::cifar, 100, 3, false}, gen);
  model.to(dev);
  auto opt = optim::make_sgd(optim::make_param_refs(model.named_parameters()), {.momentum = 0.9});
  const Tensor x = randn({batch, 3, 32, 32}, gen, {DType::f32, dev}).to(dt);
  const Tensor y = from_vector(std::vector<int64_t>(static_cast<std::size_t>(batch), 7), {batch}, {DType::i64, dev});
  auto step = [&] {
    const Tensor loss = cross_entropy(model.forward(x), y);
    opt->zero_grad();
    loss.backward();
    opt->step(0.1);
  };
  for (int i = 0; i < 5; ++i) step();
  cudaDeviceSynchronize();
  cuda::reset_peak();
  std::vector<float> ms;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(a, nullptr);
    step();
    cudaEventRecord(b, nullptr);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const auto mem = cuda::memory_stats();
  std::printf("hadatrain %s batch %lld %s forward: %.2f ms/step, %.0f img/s, peak allocated %.2f GiB\n", name.c_str(),
              static_cast<long long>(batch), dtype_name(dt).data(), med, batch / med * 1000.0,
              static_cast<double>(mem.peak_allocated_bytes) / (1 << 30));
  return 0;
}
