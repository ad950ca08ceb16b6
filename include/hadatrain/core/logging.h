// Logging through spdlog's default logger; the CLI makes it "hadatrain" on stderr and sets its level.
#pragma once
#include <spdlog/spdlog.h>

namespace ht::logging {

// Note [Log on stderr]
// The CLI's log lines and its terminal progress line (train::RunLog) go to stderr; stdout carries a command's
// results alone: train's and eval's result line, generate's text, the reports of inspect-grads and
// inspect-checkpoint. So `hadatrain eval ... > result.txt` holds the result, `generate ... | wc -w` counts only the
// text, and `2>&1` keeps both in one stream as before. Errors ("error: ...") were on stderr already.

// Sets the level from a name: trace, debug, info, warn, error, off. Throws ht::Error on an unknown name.
// A rank other than 0 (set_rank) logs warnings and errors whatever the level asks for.
void set_level(const std::string& level);

// Note [Logs of several ranks]
// Every rank of a job runs the same command and would log the same progress: with eight ranks each line eight
// times, interleaved. Called with the job's placement, this tags each line with its rank ("[rank 1]") and lets the
// ranks other than 0 log warnings and errors only: rank 0 tells the run's progress once, and every rank still tells
// what went wrong on it. One process (world_size 1) logs as before.
void set_rank(int rank, int world_size);
// Whether this process is rank 0 of its job, or alone (set_rank).
bool first_rank();

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) { spdlog::info(f, std::forward<Args>(args)...); }
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) { spdlog::warn(f, std::forward<Args>(args)...); }
// A warning that every rank of a job would give alike (about the config they all read): rank 0 gives it.
template <class... Args>
void warn_once_per_job(fmt::format_string<Args...> f, Args&&... args) {
  if (first_rank()) spdlog::warn(f, std::forward<Args>(args)...);
}
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) { spdlog::debug(f, std::forward<Args>(args)...); }
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) { spdlog::error(f, std::forward<Args>(args)...); }

}  // namespace ht::logging
