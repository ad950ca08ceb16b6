// Device: where a tensor's storage lives (the CPU, or CUDA device n).
#pragma once
#include <string>

#include <fmt/format.h>

namespace ht {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  friend bool operator==(const Device&, const Device&) = default;
};

std::string to_string(Device d);   // "cpu", "cuda:0"
Device parse_device(const std::string& s);  // "cpu", "cuda", "cuda:1"; throws ht::Error otherwise

// True when this binary was built with the CUDA backend.
bool built_with_cuda();
// Number of visible CUDA devices (0 in a CPU-only build or without a GPU).
int cuda_device_count();

}  // namespace ht

template <>
struct fmt::formatter<ht::Device> : fmt::formatter<std::string> {
  auto format(const ht::Device& d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(ht::to_string(d), ctx);
  }
};
