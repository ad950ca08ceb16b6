// `hadatrain version`: the version and the build's CUDA support and communicator engines.
#include <fmt/format.h>

#include "commands.h"
#include "hadatrain/dist/communicator.h"
#include "hadatrain/tensor/device.h"

namespace ht::cli {

Command add_version_command(CLI::App& app) {
  Command c;
  c.app = app.add_subcommand("version", "Print the version, whether CUDA was built in and the CUDA device count");
  c.run = [] {
    fmt::print("hadatrain {}\n", HADATRAIN_VERSION);
    fmt::print("built with CUDA: {}\n", built_with_cuda() ? "yes" : "no");
    fmt::print("CUDA devices: {}\n", cuda_device_count());
    std::string engines;
    for (const auto& e : dist::compiled_engines()) engines += (engines.empty() ? "" : ", ") + e;
    fmt::print("communicator engines: {}\n", engines.empty() ? "none" : engines);
    return 0;
  };
  return c;
}

}  // namespace ht::cli
