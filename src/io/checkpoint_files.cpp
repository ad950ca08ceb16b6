// Checkpoint directories: step_<N>.tmp/ written and fsync'ed, renamed (or, over a checkpoint of the same step,
// exchanged) into place, then `latest`/`best` replaced atomically and old checkpoints pruned (Note [Checkpoint
// directory protocol], Note [Replacing a checkpoint of the same step]).
#include "hadatrain/io/checkpoint_files.h"

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <mutex>
#include <sstream>

#include "hadatrain/core/logging.h"
#include "hadatrain/io/atomic_file.h"

namespace ht::io {
namespace fs = std::filesystem;
using nlohmann::json;

// Note [Replacing a checkpoint of the same step]
// A step is saved again (a step checkpoint written again after its evaluation, an epoch checkpoint rewritten: Note
// [Step evaluations] in src/train/trainer.cpp) while `latest` already names it, so step_<N> must never be missing.
// Once step_<N>.tmp is complete and fsync'ed, save_checkpoint swaps it with step_<N> in one step
// (renameat2(RENAME_EXCHANGE)), then removes step_<N>.tmp, which holds the old copy from then on. Where the file
// system refuses the exchange (EINVAL, ENOSYS, EOPNOTSUPP) it takes two renames: step_<N> -> step_<N>.old.tmp, then
// step_<N>.tmp -> step_<N>. A process stopped between those leaves no step_<N>, but two complete copies:
// step_<N>.old.tmp, and step_<N>.tmp, fsync'ed before the first rename, the newer one. recover_replacements puts
// the newer one back (else the old one) before anything reads or tidies a root: the listing, the `latest` and `best`
// resolution, and every save (whose leftover clean-up would otherwise delete both). It acts only where
// step_<N>.old.tmp exists: a complete step_<N>.tmp without it is a save stopped before its rename (the first save of
// step N, whose files may not all be in, a sharded one's shards last; `latest` never named it), a leftover as before.
// Two processes recovering the same root at once (the ranks of a run resuming) race harmlessly: a rename onto a
// step_<N> that another one has put back fails, and step_<N> is then there.

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kEmaFile = "ema.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kLatestFile = "latest";
constexpr const char* kBestFile = "best";

std::string step_name(int64_t step) { return fmt::format("step_{}", step); }

// "step_<digits>" -> the step; anything else (including step_7.tmp) -> nullopt.
std::optional<int64_t> parse_step_name(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() <= kPrefix.size() || name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;
  return v;
}

bool is_complete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / kModelFile, ec) &&
         fs::is_regular_file(dir / kStateFile, ec);
}

// Leftovers of interrupted saves and prunes: step_<N>.tmp, step_<N>.old.tmp, step_<N>.shards.tmp and
// step_<N>.pruned.tmp directories. Returns the step_<N> name a leftover belongs to, nullopt for any other name.
std::optional<std::string> leftover_of(const std::string& name) {
  for (std::string_view suffix : {".old.tmp", ".shards.tmp", ".pruned.tmp", ".tmp"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix) &&
        parse_step_name(std::string_view(name).substr(0, name.size() - suffix.size())))
      return name.substr(0, name.size() - suffix.size());
  }
  return std::nullopt;
}

std::mutex& hooks_mutex() {
  static std::mutex m;
  return m;
}
ReplaceTestHooks& hooks_slot() {
  static ReplaceTestHooks hooks;
  return hooks;
}
ReplaceTestHooks test_hooks() {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  return hooks_slot();
}

fs::path with_suffix(const fs::path& dir, const char* suffix) {
  fs::path p = dir;
  p += suffix;
  return p;
}

// Swaps the directory entries `a` and `b` in one step (Note [Replacing a checkpoint of the same step]). False when
// the file system or the kernel cannot; any other failure throws, naming both.
bool exchange_entries(const fs::path& a, const fs::path& b) {
  if (test_hooks().exchange == ExchangeSupport::refused) return false;
#if defined(__linux__)
#ifndef RENAME_EXCHANGE
  constexpr unsigned kRenameExchange = 1U << 1;  // <linux/fs.h>
#else
  constexpr unsigned kRenameExchange = RENAME_EXCHANGE;
#endif
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 28))
  const int rc = ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange);
#elif defined(SYS_renameat2)
  const int rc = static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange));
#else
  errno = ENOSYS;
  const int rc = -1;
#endif
  if (rc == 0) return true;
  const int err = errno;
  if (err == EINVAL || err == ENOSYS || err == EOPNOTSUPP) return false;
  throw fs::filesystem_error("exchanging the directories failed", a, b, std::error_code(err, std::generic_category()));
#else
  return false;
#endif
}

// Puts back a step_<N> that a replacement stopped between its two renames left missing (Note [Replacing a checkpoint
// of the same step]). Never throws: what cannot be put back is reported and left for a later call.
void recover_replacements(const fs::path& root) noexcept {
  constexpr std::string_view kOld = ".old.tmp";
  std::error_code ec;
  std::vector<int64_t> steps;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= kOld.size() || !name.ends_with(kOld)) continue;
    if (std::optional<int64_t> step = parse_step_name(std::string_view(name).substr(0, name.size() - kOld.size())))
      steps.push_back(*step);
  }
  for (const int64_t step : steps) {
    const fs::path dir = checkpoint_dir(root, step), tmp = with_suffix(dir, ".tmp"), old = with_suffix(dir, ".old.tmp");
    if (fs::exists(fs::symlink_status(dir, ec))) continue;  // in place: step_<N>.old.tmp is a leftover
    const bool newer = is_complete(tmp);
    if (!newer && !is_complete(old)) continue;
    const fs::path& from = newer ? tmp : old;
    fs::rename(from, dir, ec);
    if (ec && !is_complete(dir)) {
      logging::warn("{} is missing after an interrupted replacement; putting back {} failed: {}", dir.string(),
                    from.string(), ec.message());
      continue;
    }
    if (!ec) {
      logging::warn("recovered {} from {} ({}), left by a save of the same step that was stopped between its two "
                    "renames",
                    dir.string(), from.string(), newer ? "the new copy, complete" : "the previous copy");
      try {
        fsync_directory(root);
      } catch (const std::exception& e) {
        logging::warn("{}", e.what());
      }
    }
    if (newer) fs::remove_all(old, ec);
  }
}

// The step a pointer file (`latest`, `best`) names, when it names a complete checkpoint.
std::optional<int64_t> read_pointer(const fs::path& root, const char* file) {
  std::ifstream in(root / file);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  const std::optional<int64_t> step = parse_step_name(line);
  if (!step) {
    logging::warn("checkpoint pointer '{}' does not hold a step_<N> name (found '{}'); ignoring it",
              (root / file).string(), line);
    return std::nullopt;
  }
  if (!is_complete(checkpoint_dir(root, *step))) {
    logging::warn("checkpoint pointer '{}' names {}, which is not a complete checkpoint; ignoring it",
              (root / file).string(), line);
    return std::nullopt;
  }
  return step;
}

std::string read_text(const fs::path& path, const fs::path& dir) {
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "checkpoint '{}': cannot open {}", dir.string(), path.filename().string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void prune(const fs::path& root, int64_t written, int keep_last) {
  std::vector<int64_t> older;
  for (int64_t s : list_checkpoints(root))
    if (s < written) older.push_back(s);
  std::sort(older.rbegin(), older.rend());  // newest first
  const std::optional<int64_t> best = best_checkpoint_step(root);
  const std::size_t keep_older = static_cast<std::size_t>(std::max(keep_last - 1, 0));
  // A pruned checkpoint is renamed to step_<N>.pruned.tmp before its files go: a process stopped while removing
  // them leaves a leftover the next save removes, never a step_<N> folder missing some of its files.
  for (std::size_t i = keep_older; i < older.size(); ++i) {
    if (best && *best == older[i]) continue;
    fs::path doomed = checkpoint_dir(root, older[i]);
    doomed += ".pruned.tmp";
    fs::remove_all(doomed);
    fs::rename(checkpoint_dir(root, older[i]), doomed);
    fs::remove_all(doomed);
  }
}

// The first line of a pointer file, whatever it names ("" when there is none).
std::string pointer_name(const fs::path& root, const char* file) {
  std::ifstream in(root / file);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

void remove_leftovers(const fs::path& root, const fs::path& keep) {
  recover_replacements(root);
  const std::string latest = pointer_name(root, kLatestFile), best = pointer_name(root, kBestFile);
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::optional<std::string> owner = leftover_of(entry.path().filename().string());
    if (entry.path() == keep || !entry.is_directory() || !owner) continue;
    // A complete copy of a checkpoint that `latest` or `best` names but that is missing (one recover_replacements
    // could not put back) may be its only copy: it stays.
    if ((*owner == latest || *owner == best) && !is_complete(root / *owner) && is_complete(entry.path())) {
      logging::warn("keeping {}: it may be the only copy of {}, which {} names", entry.path().string(),
                    (root / *owner).string(), *owner == latest ? kLatestFile : kBestFile);
      continue;
    }
    logging::info("removing {} left by an interrupted checkpoint save", entry.path().string());
    fs::remove_all(entry.path());
  }
}

// A failed save leaves no partial directory behind and puts back a same-step checkpoint it had moved aside.
void restore_after_failure(const fs::path& tmp_dir, const fs::path& old_dir, const fs::path& final_dir) noexcept {
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  if (!fs::exists(final_dir, ec) && fs::exists(old_dir, ec)) fs::rename(old_dir, final_dir, ec);
}

}  // namespace

fs::path checkpoint_dir(const fs::path& root, int64_t step) { return root / step_name(step); }

void set_replace_test_hooks(ReplaceTestHooks hooks) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  hooks_slot() = std::move(hooks);
}

fs::path save_checkpoint(const fs::path& root, const CheckpointData& data, const CheckpointSaveOptions& opts) {
  HT_CHECK(data.step >= 0, "save_checkpoint: step must be >= 0, got {}", data.step);
  HT_CHECK(opts.keep_last >= 0, "save_checkpoint: keep_last must be >= 0 (0 keeps every checkpoint), got {}",
           opts.keep_last);
  HT_CHECK(!data.model.empty() || !data.adopt_files.empty(), "save_checkpoint: step {} has no model tensors",
           data.step);
  const fs::path final_dir = checkpoint_dir(root, data.step);
  fs::path tmp_dir = final_dir;
  tmp_dir += ".tmp";
  fs::path old_dir = final_dir;
  old_dir += ".old.tmp";

  std::string state_text;
  try {
    state_text = data.state.dump(2) + "\n";
  } catch (const json::exception& e) {
    HT_FAIL("checkpoint '{}': cannot encode {}: {}", final_dir.string(), kStateFile, e.what());
  }

  try {
    fs::create_directories(root);
    recover_replacements(root);  // before step_<N>.tmp, which may be the only copy of step_<N>, is cleared
    fs::remove_all(tmp_dir);
    fs::create_directory(tmp_dir);

    Metadata meta = data.model_metadata;
    meta["format"] = "pt";  // what HF loaders expect of a PyTorch safetensors file
    meta["step"] = std::to_string(data.step);
    save_safetensors(tmp_dir / kModelFile, data.model, meta);
    if (data.optimizer)
      save_safetensors(tmp_dir / kOptimizerFile, *data.optimizer,
                       {{"format", "pt"}, {"step", std::to_string(data.step)}});
    if (!data.ema.empty())
      save_safetensors(tmp_dir / kEmaFile, data.ema, {{"format", "pt"}, {"step", std::to_string(data.step)}});
    write_file_atomic(tmp_dir / kStateFile, state_text);
    for (const fs::path& f : data.adopt_files) fs::rename(f, tmp_dir / f.filename());
    // The adopted files' folders (a sharded save's step_<N>.shards.tmp) are empty now: removed here, so that
    // remove_leftovers reports only what an interrupted save left. A folder still holding something stays.
    for (const fs::path& f : data.adopt_files) {
      std::error_code ec;
      if (f.has_parent_path() && fs::is_empty(f.parent_path(), ec) && !ec) fs::remove(f.parent_path(), ec);
    }
    fsync_directory(tmp_dir);

    // Into place. An existing checkpoint of the same step is exchanged with the new one in one step, or moved
    // aside first where the file system cannot (Note [Replacing a checkpoint of the same step]).
    if (!fs::exists(fs::symlink_status(final_dir))) {
      fs::rename(tmp_dir, final_dir);
      fsync_directory(root);
    } else if (exchange_entries(tmp_dir, final_dir)) {
      fsync_directory(root);
      fs::remove_all(tmp_dir);  // the previous copy of the step
    } else {
      fs::remove_all(old_dir);
      fs::rename(final_dir, old_dir);
      if (const ReplaceTestHooks hooks = test_hooks(); hooks.between_renames) hooks.between_renames(final_dir);
      std::error_code ec;
      fs::rename(tmp_dir, final_dir, ec);
      // Another process reading the root in between (recover_replacements) may have put step_<N>.tmp in place.
      if (ec && (fs::exists(tmp_dir) || !is_complete(final_dir)))
        throw fs::filesystem_error("rename", tmp_dir, final_dir, ec);
      fsync_directory(root);
      fs::remove_all(old_dir);
    }

    const std::string pointer = step_name(data.step) + "\n";
    write_file_atomic(root / kLatestFile, pointer);
    if (opts.best == MarkBest::yes) write_file_atomic(root / kBestFile, pointer);

    try {  // the checkpoint is safely written; failing to tidy up must not fail the save
      remove_leftovers(root, final_dir);
      if (opts.keep_last > 0) prune(root, data.step, opts.keep_last);
      fsync_directory(root);
    } catch (const std::exception& e) {
      logging::warn("checkpoint {} was written, but pruning older checkpoints failed: {}", final_dir.string(), e.what());
    }
  } catch (const fs::filesystem_error& e) {
    restore_after_failure(tmp_dir, old_dir, final_dir);
    HT_FAIL("checkpoint '{}': {}", final_dir.string(), e.what());
  } catch (...) {
    restore_after_failure(tmp_dir, old_dir, final_dir);
    throw;
  }
  return final_dir;
}

std::vector<int64_t> list_checkpoints(const fs::path& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  recover_replacements(root);
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::optional<int64_t> step = parse_step_name(entry.path().filename().string());
    if (!step) continue;
    if (is_complete(entry.path())) steps.push_back(*step);
    else logging::warn("ignoring incomplete checkpoint directory '{}' (it lacks {} or {})", entry.path().string(),
                   kModelFile, kStateFile);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<int64_t> latest_checkpoint_step(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  recover_replacements(root);
  if (std::optional<int64_t> step = read_pointer(root, kLatestFile)) return step;
  const std::vector<int64_t> steps = list_checkpoints(root);
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

std::optional<int64_t> best_checkpoint_step(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  recover_replacements(root);
  return read_pointer(root, kBestFile);
}

void point_best_at(const fs::path& root, int64_t step) {
  const fs::path dir = checkpoint_dir(root, step);
  HT_CHECK(is_complete(dir), "cannot point '{}' at {}: it is not a complete checkpoint", (root / kBestFile).string(),
           dir.string());
  write_file_atomic(root / kBestFile, step_name(step) + "\n");
}

fs::path resolve_checkpoint_pointer(const fs::path& path) {
  const std::string file = path.filename().string();
  std::error_code ec;
  // A step_<N> folder named directly may be one a replacement stopped between its renames left missing.
  if (parse_step_name(file) && !fs::exists(path, ec) && fs::is_directory(path.parent_path(), ec))
    recover_replacements(path.parent_path());
  if ((file != kLatestFile && file != kBestFile) || !fs::is_regular_file(path, ec)) return path;
  const fs::path root = path.parent_path();
  const std::optional<int64_t> step = file == kLatestFile ? latest_checkpoint_step(root) : best_checkpoint_step(root);
  HT_CHECK(step.has_value(), "checkpoint pointer '{}' names no complete checkpoint", path.string());
  return checkpoint_dir(root, *step);
}

Checkpoint load_checkpoint_dir(const fs::path& dir) {
  HT_CHECK(fs::is_directory(dir), "checkpoint '{}' is not a directory", dir.string());
  for (const char* required : {kModelFile, kStateFile})
    HT_CHECK(fs::is_regular_file(dir / required), "checkpoint '{}': {} is missing (an incomplete or foreign "
             "directory)", dir.string(), required);
  Checkpoint ck;
  ck.dir = dir;
  ck.model = load_safetensors(dir / kModelFile);
  if (fs::exists(dir / kOptimizerFile)) ck.optimizer = load_safetensors(dir / kOptimizerFile);
  if (fs::exists(dir / kEmaFile)) ck.ema = load_safetensors(dir / kEmaFile);
  const std::string text = read_text(dir / kStateFile, dir);
  try {
    ck.state = json::parse(text);
  } catch (const json::exception& e) {
    HT_FAIL("checkpoint '{}': {} is not valid JSON: {}", dir.string(), kStateFile, e.what());
  }

  ck.step = checkpoint_step(ck.model.metadata, dir);
  return ck;
}

int64_t checkpoint_step(const Metadata& model_metadata, const fs::path& dir) {
  auto it = model_metadata.find("step");
  std::optional<int64_t> step;
  if (it != model_metadata.end()) step = parse_step_name("step_" + it->second);
  if (!step) {
    const fs::path name = dir.has_filename() ? dir.filename() : dir.parent_path().filename();  // "ck/step_5/"
    step = parse_step_name(name.string());
  }
  return step.value_or(-1);
}

std::optional<Checkpoint> load_latest_checkpoint(const fs::path& root) {
  const std::optional<int64_t> step = latest_checkpoint_step(root);
  if (!step) return std::nullopt;
  return load_checkpoint_dir(checkpoint_dir(root, *step));
}

}  // namespace ht::io
