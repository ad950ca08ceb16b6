// Checkpoint directories on disk (the files only; the Trainer decides what goes in them):
//   <root>/step_<N>/model.safetensors      model tensors (metadata "format": "pt", "step": "<N>")
//   <root>/step_<N>/optimizer.safetensors  optimizer tensors (only when the caller gives some)
//   <root>/step_<N>/ema.safetensors        the weight average, by the model's tensor names (only when given)
//   <root>/step_<N>/state.json             the caller's JSON (the Trainer's: step, loader position, best score,
//                                          epoch loss, dropout RNG, optimizer name and steps, run, seed, EMA updates)
//   <root>/latest                          "step_<N>\n": the checkpoint to resume from
//   <root>/best                            "step_<N>\n": the checkpoint marked best (optional)
// See Note [Checkpoint directory protocol] and docs/checkpoints.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "hadatrain/io/safetensors.h"

namespace ht::io {

// Note [Checkpoint directory protocol]
// save_checkpoint writes every file into <root>/step_<N>.tmp/ (each atomically and fsync'ed), then renames the
// directory to step_<N> (over a checkpoint of the same step: exchanges the two, Note [Replacing a checkpoint of
// the same step] in src/io/checkpoint_files.cpp) and fsyncs <root>; only then does it replace `latest` (and
// `best`) atomically and prune. So a step_<N> directory is always complete, a crash leaves at worst a
// step_<N>.tmp/ that loading ignores and the next save removes, and `latest` never names a directory that is not
// complete. On a file system without the exchange, a crash between its two renames leaves step_<N> missing and
// two complete copies beside it; listing, resolving `latest` or `best`, and saving put the newer one back first.
// Loading follows `latest` when it names a complete checkpoint; when `latest` is missing or stale it falls
// back to the highest complete step_<N>. Pruning (keep_last K) only considers checkpoints with a step below the
// one just written: it keeps the newest K (counting the new one), never deletes the one `best` names, and never
// deletes higher-numbered checkpoints (those are left by an abandoned run resumed from an earlier step). A pruned
// step_<N> is renamed to step_<N>.pruned.tmp/ before its files are removed (a leftover if that is interrupted).
// A sharded checkpoint's ranks write their shards into <root>/step_<N>.shards.tmp/ first (a leftover like
// the others); save_checkpoint moves them into step_<N>.tmp/ (CheckpointData::adopt_files) before the rename.

enum class MarkBest { no, yes };

struct CheckpointData {
  int64_t step = 0;
  TensorList model;
  // nullopt: no optimizer.safetensors is written; an empty list writes one without tensors (an optimiser that
  // keeps no state, such as SGD without momentum, or none yet), which a resume then finds.
  std::optional<TensorList> optimizer;
  TensorList ema;        // the weight average (config `ema`), by the model's names; empty: no ema.safetensors
  nlohmann::json state = nlohmann::json::object();
  Metadata model_metadata;  // extra __metadata__ for model.safetensors ("format" and "step" are set by us)
  // Files already written and fsync'ed elsewhere on the same filesystem (a sharded checkpoint's per-rank
  // shards): moved into the checkpoint directory before it is published, keeping their names. With any,
  // `model` may be empty (model.safetensors then holds no tensors, only the metadata).
  std::vector<std::filesystem::path> adopt_files;
};

struct CheckpointSaveOptions {
  int keep_last = 0;  // keep at most this many step_<N> directories (plus the best one); 0 keeps them all
  MarkBest best = MarkBest::no;  // also point `best` at this checkpoint
};

struct Checkpoint {
  int64_t step = -1;  // from model.safetensors metadata, else from the directory name; -1 when neither says
  std::filesystem::path dir;
  SafetensorsContents model;
  std::optional<SafetensorsContents> optimizer;  // nullopt when there is no optimizer.safetensors
  std::optional<SafetensorsContents> ema;        // nullopt when there is no ema.safetensors
  nlohmann::json state;
};

// <root>/step_<step>
std::filesystem::path checkpoint_dir(const std::filesystem::path& root, int64_t step);

// Writes <root>/step_<data.step>/ (creating root if needed), replacing an existing checkpoint of the same step,
// updates `latest` (and `best`), prunes, and returns the checkpoint directory. Errors name the directory/file.
std::filesystem::path save_checkpoint(const std::filesystem::path& root, const CheckpointData& data,
                                      const CheckpointSaveOptions& opts = {});

// Steps of the complete checkpoints under root (step_<N> directories holding model.safetensors and
// state.json; *.tmp directories are ignored), ascending. Empty when root does not exist.
std::vector<int64_t> list_checkpoints(const std::filesystem::path& root);
// The checkpoint to resume from (see the Note), or nullopt when root holds none.
std::optional<int64_t> latest_checkpoint_step(const std::filesystem::path& root);
// The step `best` names when it names a complete checkpoint, else nullopt.
std::optional<int64_t> best_checkpoint_step(const std::filesystem::path& root);
// Points `best` (atomically) at the complete checkpoint step_<step>: a resume's repair of a pointer that a process
// stopped between writing a checkpoint and its `best` left behind. Throws ht::Error naming the folder when
// step_<step> is not complete.
void point_best_at(const std::filesystem::path& root, int64_t step);

// A checkpoint pointer file (<root>/latest or <root>/best) resolved to the step_<N> folder it names, so that every
// command that takes a checkpoint takes a pointer too; any other path comes back as it is. A pointer that names no
// complete checkpoint is an error naming it.
std::filesystem::path resolve_checkpoint_pointer(const std::filesystem::path& path);

// Test hooks for the fault tests (tests/fault): a file system without renameat2(RENAME_EXCHANGE), and a process
// stopped between the two renames that then replace a checkpoint of the same step. `refused` makes save_checkpoint
// take the two renames; `between_renames` is called after step_<N> was moved to step_<N>.old.tmp and before
// step_<N>.tmp takes its place, with step_<N>'s path. Process-wide; not for use outside tests.
enum class ExchangeSupport { as_the_file_system_says, refused };
struct ReplaceTestHooks {
  ExchangeSupport exchange = ExchangeSupport::as_the_file_system_says;
  std::function<void(const std::filesystem::path& dir)> between_renames;
};
void set_replace_test_hooks(ReplaceTestHooks hooks);

// Loads one checkpoint directory (tensors on the CPU). Errors name the directory and the file.
Checkpoint load_checkpoint_dir(const std::filesystem::path& dir);
// The step of the checkpoint in `dir` whose model.safetensors holds `model_metadata`: its "step", else the folder's
// name step_<N>; -1 when neither says (Checkpoint::step).
int64_t checkpoint_step(const Metadata& model_metadata, const std::filesystem::path& dir);
// Loads the latest complete checkpoint under root, or nullopt when there is none.
std::optional<Checkpoint> load_latest_checkpoint(const std::filesystem::path& root);

}  // namespace ht::io
