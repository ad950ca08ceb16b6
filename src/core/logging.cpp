// Log level control for the spdlog default logger.
#include "hadatrain/core/logging.h"

#include "hadatrain/core/error.h"

namespace ht::logging {
void set_level(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  HT_CHECK(level == "off" || lvl != spdlog::level::off,
           "unknown log level '{}': expected trace, debug, info, warn, error or off", level);
  spdlog::set_level(lvl);
}
}  // namespace ht::logging
