// The checkpointer: writes the run's state as an atomic checkpoint (io/checkpoint_files.h) and loads it back
// for an exact resume (Note [Exact resume] in checkpointer.cpp). Internal to src/train. Which tensors stand
// for the model and the optimiser is decided in one place (model_tensors / optimizer_tensors and their
// loaders in checkpointer.cpp): both read and write through the optimiser's parameter store.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "hadatrain/data/loader.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/nn/module.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/philox.h"
#include "hadatrain/train/peft_adapter.h"
#include "hadatrain/train/trainer.h"
#include "ema.h"

namespace ht::train {

// What a checkpoint holds besides tensors and generator streams.
struct RunState {
  int64_t step = 0;               // optimiser steps done
  data::LoaderPosition position;  // where the training loader continues
  double best_score = 0.0;        // the best evaluation score so far (Task::initial_score before any)
  // The best score of an evaluation that came with a checkpoint that can become `best` (an epoch checkpoint, or a
  // step checkpoint at a step evaluation: Note [Step evaluations] in trainer.cpp); the other evaluations do not
  // count here.
  double best_checkpoint_score = 0.0;
  // The step of the checkpoint with that score, the one `best` names (-1: none yet). A resume re-points `best` at it
  // when a process stopped between writing that checkpoint and `best` (Note [Best after a kill] in checkpointer.cpp).
  int64_t best_checkpoint_step = -1;
  // The epoch in progress (position.epoch) up to position.batch: the sum of its steps' losses and their
  // number, so that an epoch split by a resume reports the train_loss of all its steps.
  double epoch_loss = 0.0;
  int64_t epoch_steps = 0;
  // The steps since the last train record of metrics.jsonl: their loss sum and number, so that a resumed run's
  // next record averages the same steps as the uninterrupted run's.
  double window_loss = 0.0;
  int64_t window_steps = 0;
};

// A rank's part in a save under dist (train/distributed.h): every rank calls save at the same steps and only the
// writer (rank 0) writes; `outcomes` gives every rank's outcome of a save, on every rank (one collective: each
// passes its own SaveOutcome as int), so that all take the same course whichever rank failed. Unset outside dist.
struct RankRole {
  bool writer = true;
  std::function<std::vector<int>(int outcome)> outcomes;
};

// When the optimiser's store holds only this rank's shards (dist.mode fsdp, train/distributed.h): the whole
// model and optimiser tensors a checkpoint holds, gathered from every rank's shards (collectives: every rank
// calls save; only the writer writes), and the loaders that cut whole tensors into this rank's shards.
struct ShardedState {
  std::function<std::map<std::string, Tensor>()> model, optimizer;
  std::function<void(const std::map<std::string, Tensor>&)> load_model;
  std::function<std::map<std::string, Tensor>(const std::map<std::string, Tensor>&)> shard_optimizer;
  // checkpoint.sharded (set: a sharded checkpoint, nothing is gathered): every rank writes its own
  // shard-<rank>-of-<N>.safetensors into `dir` for `step` (barriers before and after: when it returns every
  // rank's file is durable) and gets every rank's file back, which the writer moves into the checkpoint
  // (io::CheckpointData::adopt_files); `unsharded` is what model.safetensors holds then: the buffers (every
  // parameter, frozen ones too, is in the shards).
  // write_shards throws on every rank when any rank could not write (each says whether it was this one).
  std::function<std::vector<std::filesystem::path>(const std::filesystem::path& dir, int64_t step)> write_shards;
  std::function<std::map<std::string, Tensor>()> unsharded;
};

// How a save went on one rank; a save's outcome over the ranks is the worst of theirs.
enum class SaveOutcome : int { written = 0, failed = 1, diverged = 2 };

// The objects whose state a checkpoint holds; they outlive the Checkpointer.
struct CheckpointedParts {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  Generator* dropout_gen = nullptr;
  const ShardedState* sharded = nullptr;  // unset: the optimiser's store holds the whole model
  RankRole role;                          // under dist: ddp and fsdp alike
  WeightEma* ema = nullptr;               // config `ema`: its average goes into ema.safetensors
};

struct CheckpointerOptions {
  std::filesystem::path dir;  // checkpoint.dir: step_<N> directories, `latest`, `best`
  int keep_last = 0;          // checkpoint.keep_last (0 keeps all)
  bool keep_best = true;      // checkpoint.keep_best: point `best` at the best-scoring checkpoint
  std::string run_name;       // recorded in the state
  uint64_t seed = 0;          // run.seed, recorded in the state
  int64_t batch_size = 0;     // data.batch_size, recorded in the state (the loader position counts its batches)
  // The training data as the loader position refers to it, recorded in the state: its rows (samples) and, for
  // language-model data, their digest (data::TextDataset::digest). --resume refuses data that differs.
  int64_t train_rows = 0;
  std::optional<uint64_t> train_digest;
  std::string score_name;     // Task::score_name; the state key is "best_<score_name>"
  io::Metadata model_metadata;  // extra model.safetensors metadata (a language model's config, its tokenizer)
  // checkpoint.on_save_failure: a save that fails (disk full, I/O error) stops the run (false) or is
  // logged as a warning and training goes on (true).
  bool continue_on_save_failure = false;
};

class Checkpointer {
 public:
  Checkpointer(CheckpointerOptions o, CheckpointedParts parts);

  // Loads the checkpoint `from` names into the parts and returns its run state (the caller seeks its loader
  // to state.position); nullopt for ResumeFrom::Kind::none. Throws ht::Error naming the directory when
  // there is no checkpoint or it lacks optimiser state.
  std::optional<RunState> resume(const ResumeFrom& from);

  // Writes the parts' state with `state` as step_<state.step>, points `latest` at it (and `best` with
  // MarkBest::yes when keep_best is set), prunes to keep_last and logs the directory. Throws ht::Error naming
  // the step and the first non-finite model tensor, writing nothing, when the model holds a NaN or infinity.
  // A save that fails (an I/O error: io::save_checkpoint leaves every earlier checkpoint as it was) throws
  // ht::Error naming the step, the cause and the last good checkpoint, or with continue_on_save_failure logs
  // that as a warning and returns an empty path. Under dist every rank calls it and every rank takes the same
  // course, whichever rank failed (RankRole::outcomes); ranks other than the writer return the directory the
  // writer wrote.
  std::filesystem::path save(const RunState& state, io::MarkBest best);

  const std::filesystem::path& dir() const { return o_.dir; }
  // "the last good checkpoint is DIR", or that there is none yet in dir().
  std::string last_good_checkpoint() const;
  // The directory resume() loaded ("" before a resume).
  const std::filesystem::path& resumed_from() const { return resumed_from_; }

 private:
  // save() without the failure policy: throws ht::Error when the checkpoint is not written; sets `diverged`
  // first when that is because the model holds a non-finite value.
  std::filesystem::path write(const RunState& state, io::MarkBest best, bool& diverged);

  // Points `best` at step_<step>, the best checkpoint a resumed state records, when it names another
  // (Note [Best after a kill] in checkpointer.cpp); the writer only, with keep_best.
  void repoint_best(int64_t step) const;

  // Throws ht::Error when the checkpoint's run trained on other rows than o_ describes.
  void check_same_data(const io::Checkpoint& ck) const;
  // Throws ht::Error when the parameters with optimiser state in the checkpoint are not the ones that train now.
  void check_same_trained_parameters(const io::Checkpoint& ck, int64_t optimizer_steps) const;

  CheckpointerOptions o_;
  CheckpointedParts parts_;
  std::filesystem::path resumed_from_;
};

// What `hadatrain eval` evaluates: a run's checkpoint, the weights of a Hugging Face LLaMA folder (HF names, no
// optimiser state, reported as step 0), or a PEFT LoRA adapter folder: its base's weights (base_model_name_or_path,
// in ck.model) with its adapters on them, step 0.
enum class EvalSource { checkpoint, hf_folder, peft_folder };
struct EvalWeights {
  io::Checkpoint ck;
  EvalSource source = EvalSource::checkpoint;
  std::optional<PeftFolder> peft;  // peft_folder: the folder (ck.dir)
  std::filesystem::path base;      // peft_folder: the base model's folder, which ck.model holds
};
// `hadatrain eval`: the checkpoint at `dir` (a step_<N> directory, or a checkpoint root whose latest is used), or
// the HF folder at `dir` (config.json without state.json); throws ht::Error naming `dir` when there is none, and
// naming the checkpoint and its first non-finite model tensor when its weights hold a NaN or infinity (evaluating
// them would report a NaN loss).
EvalWeights read_checkpoint_for_eval(const std::string& dir);
// checkpoint.dir checked at a run's start, before any step: created when missing, and a writable directory;
// throws ht::Error naming `dir` otherwise.
void check_checkpoint_dir_usable(const std::filesystem::path& dir);
// The checkpoint's model tensors loaded into `model`.
void load_model_state(nn::Module& model, const io::Checkpoint& ck);
// `hadatrain eval`: the same, after checking that the checkpoint fits the model the eval's config builds. A
// checkpoint with LoRA adapters and a config without model.lora (or the other way round), and a tensor of another
// shape, are errors naming the checkpoint (and the tensor with both shapes) and the config to evaluate it with.
// An HF folder's weights go in as `model.init_from` would load them (models::load_hf_tensors: tied embeddings, fresh
// LoRA adapters kept), into a LLaMA only.
void load_model_state_for_eval(nn::Module& model, const EvalWeights& w);

}  // namespace ht::train
