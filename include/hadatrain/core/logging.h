// Logging through spdlog. One named logger ("hadatrain"); the CLI sets its level.
#pragma once
#include <spdlog/spdlog.h>

namespace ht::logging {

// Sets the level from a name: trace, debug, info, warn, error, off. Throws ht::Error on an unknown name.
void set_level(const std::string& level);

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) { spdlog::info(f, std::forward<Args>(args)...); }
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) { spdlog::warn(f, std::forward<Args>(args)...); }
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) { spdlog::debug(f, std::forward<Args>(args)...); }
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) { spdlog::error(f, std::forward<Args>(args)...); }

}  // namespace ht::logging
