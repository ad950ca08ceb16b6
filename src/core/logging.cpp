// Log level control for the spdlog default logger.
#include "hadatrain/core/logging.h"

#include <algorithm>

#include "hadatrain/core/error.h"

namespace ht::logging {
namespace {
spdlog::level::level_enum g_floor = spdlog::level::trace;  // the least a line needs on this rank (set_rank)
bool g_first_rank = true;
}  // namespace

bool first_rank() { return g_first_rank; }

void set_level(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  HT_CHECK(level == "off" || lvl != spdlog::level::off,
           "unknown log level '{}': expected trace, debug, info, warn, error or off", level);
  spdlog::set_level(std::max(lvl, g_floor));
}

void set_rank(int rank, int world_size) {
  if (world_size <= 1) return;
  spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
  g_floor = rank == 0 ? spdlog::level::trace : spdlog::level::warn;
  g_first_rank = rank == 0;
  spdlog::set_level(std::max(spdlog::get_level(), g_floor));
}
}  // namespace ht::logging
