// The checkpointer (checkpointer.h): what a checkpoint holds, how it is written and how a run resumes.
//
// Note [Exact resume]
// A checkpoint holds everything the next step depends on: parameters and buffers (batch-norm statistics),
// optimiser state and step count, the loader position (epoch, batch) — data order and augmentation are pure
// functions of (seed, epoch, index) — the dropout generator's state (its masks are functions of (seed, step,
// draw in the step) on the trainer's step-keyed generator, Note [Step-keyed streams]), the weight average with
// config `ema` (Note [Weight EMA]), and the global step (the schedule is a function of it). Resuming rebuilds the
// run from the config, loads that state and seeks the loader, so on the CPU the resumed run computes
// bit-identical losses (tests/cpu/test_trainer.cpp).
#include "checkpointer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <map>
#include <set>
#include <system_error>
#include <type_traits>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "hadatrain/core/error.h"
#include "hadatrain/core/name_list.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/io/output_path.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/tensor/dtype.h"
#include "hadatrain/train/lm_source.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;

io::TensorList to_list(const std::map<std::string, Tensor>& m) {
  io::TensorList out;
  for (const auto& [k, v] : m) out.emplace_back(k, v);
  return out;
}

// The tensors that stand for the model and the optimiser in a checkpoint, and how they are loaded back. Both
// go through the parameter store the optimiser steps over (nn/parameter_store.h), the one owner of master
// copies and optimiser state: model.safetensors holds its state_dict (the model's parameters and buffers by
// name), optimizer.safetensors the optimiser's state by "<param name>.<slot>" with its step count in the state
// JSON. A sharded store consolidates here.
io::TensorList model_tensors(const CheckpointedParts& p) {
  return to_list(p.sharded ? p.sharded->model() : p.optimizer->store().state_dict());
}
io::TensorList optimizer_tensors(const CheckpointedParts& p) {
  return to_list(p.sharded ? p.sharded->optimizer() : p.optimizer->state_tensors());
}
void load_model_tensors(const CheckpointedParts& p, const io::Checkpoint& ck) {
  if (p.sharded) p.sharded->load_model(ck.model.tensors);
  else p.optimizer->store().load_state_dict(ck.model.tensors);
}
void load_optimizer_state(const CheckpointedParts& p, const io::Checkpoint& ck, int64_t steps) {
  p.optimizer->load_state_tensors(p.sharded ? p.sharded->shard_optimizer(ck.optimizer->tensors) : ck.optimizer->tensors,
                                  steps);
}

// One value of a checkpoint's state.json for --resume; a missing key or a value of another type is an error naming
// the file and the key (a state.json written by another program, or edited), not a JSON library message.
template <class T>
T state_value(const io::Checkpoint& ck, const std::string& key) {
  const std::string file = (ck.dir / "state.json").string();
  const auto it = ck.state.is_object() ? ck.state.find(key) : ck.state.end();
  HT_CHECK(it != ck.state.end(), "--resume: {} has no \"{}\"", file, key);
  constexpr bool text = std::is_same_v<T, std::string>, real = std::is_floating_point_v<T>,
                 non_negative = std::is_unsigned_v<T>;
  const bool ok = text ? it->is_string()
                  : real ? it->is_number()
                  : non_negative ? it->is_number_unsigned()
                                 : it->is_number_integer();
  HT_CHECK(ok, "--resume: {}: \"{}\" is {}, expected {}", file, key, it->dump(),
           text ? "a string" : real ? "a number" : non_negative ? "a non-negative integer" : "an integer");
  return it->get<T>();
}

// A count of state.json (a step, an epoch, a batch, an update count): an integer >= 0.
int64_t count_value(const io::Checkpoint& ck, const std::string& key) {
  const auto v = state_value<int64_t>(ck, key);
  HT_CHECK(v >= 0, "--resume: {}: \"{}\" is {}, expected an integer >= 0", (ck.dir / "state.json").string(), key, v);
  return v;
}

// --resume refuses a config whose `key` differs from the value the checkpoint's run recorded: the error names both
// values and how to go on (`otherwise` follows "resume with --set key=recorded").
template <class T>
void refuse_another(const io::Checkpoint& ck, const std::string& key, const T& recorded, const T& configured,
                    const std::string& otherwise) {
  if (recorded == configured) return;
  throw Error(fmt::format("--resume: the checkpoint {} was written with {} {}, but the config has {} {}; resume with "
                          "--set {}={}{}",
                          ck.dir.string(), key, recorded, key, configured, key, recorded, otherwise));
}

// The first tensor of `tensors` (in their order) holding a NaN or an infinity: "'<name>' holds NaN" or
// "'<name>' holds +infinity"; "" when every floating-point tensor is finite. One pass over a host copy of
// each tensor, so it runs only where a checkpoint is written or evaluated, never per step.
template <class Tensors>
std::string first_non_finite(const Tensors& tensors) {
  for (const auto& [name, t] : tensors) {
    if (!is_floating(t.dtype())) continue;
    for (const double v : t.template to_vector<double>()) {
      if (std::isfinite(v)) continue;
      return fmt::format("'{}' holds {}", name, std::isnan(v) ? "NaN" : v > 0 ? "+infinity" : "-infinity");
    }
  }
  return "";
}

}  // namespace

void load_model_state(nn::Module& model, const io::Checkpoint& ck) { model.load_state_dict(ck.model.tensors); }

namespace {

// What to evaluate a checkpoint with: the config its run saved beside its checkpoints
// (<run.out_dir>/config.yaml, two levels above <checkpoint.dir>/step_<N>), when it is there.
std::string run_config_hint(const io::Checkpoint& ck) {
  const fs::path saved = ck.dir.parent_path().parent_path() / "config.yaml";
  std::error_code ec;
  return fs::is_regular_file(saved, ec) ? fmt::format("the config of the run that wrote it ({})", saved.string())
                                        : std::string("the config of the run that wrote it");
}

}  // namespace

void load_model_state_for_eval(nn::Module& model, const EvalWeights& w) {
  const io::Checkpoint& ck = w.ck;
  if (w.source == EvalSource::hf_folder) {
    auto* llama = dynamic_cast<models::Llama*>(&model);
    HT_CHECK(llama != nullptr, "--checkpoint: {} is a Hugging Face LLaMA folder, but the config builds no LLaMA "
             "(model.name llama)", ck.dir.string());
    models::load_hf_tensors(*llama, ck.model.tensors, ck.dir.string());
    return;
  }
  if (w.source == EvalSource::peft_folder) {
    auto* llama = dynamic_cast<models::Llama*>(&model);
    HT_CHECK(llama != nullptr, "--checkpoint: {} is a PEFT LoRA adapter, but the config builds no LLaMA (model.name "
             "llama)", ck.dir.string());
    HT_ASSERT(w.peft.has_value(), "load_model_state_for_eval: the PEFT folder {} is not read", ck.dir.string());
    models::load_hf_tensors(*llama, ck.model.tensors, w.base.string());
    load_peft_tensors(*llama, *w.peft);
    return;
  }
  const std::map<std::string, Tensor> slots = model.state_dict();
  const auto has_adapters = [](const auto& tensors) {
    return std::any_of(tensors.begin(), tensors.end(), [](const auto& kv) { return nn::is_lora_adapter_name(kv.first); });
  };
  const bool ck_lora = has_adapters(ck.model.tensors), model_lora = has_adapters(slots);
  const auto recorded = ck.model.metadata.find(kLoraKey);
  HT_CHECK(!ck_lora || model_lora, "--checkpoint: {} holds LoRA adapters{}, but the config has no model.lora, so its "
           "model has no place for them: evaluate it with {}, or merge the adapters with hadatrain convert "
           "(--input {} --output HF_DIR, then --input HF_DIR --output DIR) and evaluate DIR",
           ck.dir.string(), recorded != ck.model.metadata.end() ? " (model.lora " + recorded->second + ")" : "",
           run_config_hint(ck), ck.dir.string());
  HT_CHECK(ck_lora || !model_lora, "--checkpoint: {} holds no LoRA adapters, but the config has model.lora: evaluate "
           "the model it holds with --set model.lora=null", ck.dir.string());
  for (const auto& [name, t] : ck.model.tensors) {
    const auto slot = slots.find(name);
    HT_CHECK(slot == slots.end() || slot->second.shape() == t.shape(), "--checkpoint: {} does not fit the model the "
             "config builds: its '{}' has shape {}, the config's model {} (another architecture or vocabulary): "
             "evaluate it with {}", ck.dir.string(), name, to_string(t.shape()), to_string(slot->second.shape()),
             run_config_hint(ck));
  }
  model.load_state_dict(ck.model.tensors);
}

Checkpointer::Checkpointer(CheckpointerOptions o, CheckpointedParts parts) : o_(std::move(o)), parts_(parts) {
  HT_ASSERT(parts_.model && parts_.optimizer && parts_.dropout_gen, "Checkpointer: a part is missing");
}

std::optional<RunState> Checkpointer::resume(const ResumeFrom& from) {
  std::optional<io::Checkpoint> ck;
  if (from.kind == ResumeFrom::Kind::latest) {
    ck = io::load_latest_checkpoint(o_.dir);
    HT_CHECK(ck.has_value(), "--resume: no checkpoint found in {}", o_.dir.string());
  } else if (from.kind == ResumeFrom::Kind::path) {
    ck = io::load_checkpoint_dir(io::resolve_checkpoint_pointer(from.path));  // a step_<N> folder, latest or best
  }
  if (!ck) return std::nullopt;
  dist::consolidate_checkpoint(*ck);  // a sharded checkpoint's shards joined: any world size resumes it
  // The seed fixes the data order and the dropout masks: a resume under another seed would continue a
  // different run from this one's weights.
  if (ck->state.is_object() && ck->state.contains("seed"))
    refuse_another(*ck, "run.seed", state_value<uint64_t>(*ck, "seed"), o_.seed, " or start a new run");
  // The loader position is a batch index: under another data.batch_size it would name other samples (some twice,
  // some never).
  if (ck->state.is_object() && ck->state.contains("batch_size") && o_.batch_size > 0)
    refuse_another(*ck, "data.batch_size", count_value(*ck, "batch_size"), o_.batch_size, " or start a new run");
  // The optimiser's state is kept by slot names of its own (SGD's momentum, AdamW's moments): under another
  // optimiser a resume would drop it and start that one's state from zero without a word.
  if (const auto it = ck->state.find("optimizer"); ck->state.is_object() && it != ck->state.end() && it->is_string())
    refuse_another(*ck, "optim.name", it->get<std::string>(), parts_.optimizer->name(),
                   ", or start a new run from its weights with model.init_from");
  check_same_data(*ck);
  // LoRA adapters were trained under the checkpoint's settings: another alpha or dropout would continue another
  // run from them (alpha scales the adapters' output), and another rank or target list does not fit them.
  const auto lora_then = ck->model.metadata.find(kLoraKey), lora_now = o_.model_metadata.find(kLoraKey);
  if (lora_then != ck->model.metadata.end() && lora_now != o_.model_metadata.end()) {
    const auto then = nlohmann::json::parse(lora_then->second, nullptr, false);
    const auto now = nlohmann::json::parse(lora_now->second, nullptr, false);
    if (then.is_object())
      for (const auto& [key, value] : now.items())
        if (then.contains(key))
          refuse_another(*ck, "model.lora." + key, then[key].dump(), value.dump(), " or start a new run");
  }
  load_model_tensors(parts_, *ck);
  HT_CHECK(ck->optimizer.has_value(), "--resume: {} has no optimizer.safetensors", ck->dir.string());
  const auto& s = ck->state;
  RunState st;
  st.step = count_value(*ck, "step");
  st.position = {count_value(*ck, "epoch"), count_value(*ck, "batch")};
  st.best_score = state_value<double>(*ck, "best_" + o_.score_name);
  const std::string best_checkpoint_key = "best_checkpoint_" + o_.score_name;
  st.best_checkpoint_score = s.contains(best_checkpoint_key) ? state_value<double>(*ck, best_checkpoint_key) : st.best_score;
  if (s.contains("best_checkpoint_step")) st.best_checkpoint_step = state_value<int64_t>(*ck, "best_checkpoint_step");
  if (s.contains("epoch_loss_sum") && s.contains("epoch_loss_steps")) {
    st.epoch_loss = state_value<double>(*ck, "epoch_loss_sum");
    st.epoch_steps = count_value(*ck, "epoch_loss_steps");
  }
  if (s.contains("window_loss_sum") && s.contains("window_loss_steps")) {
    st.window_loss = state_value<double>(*ck, "window_loss_sum");
    st.window_steps = count_value(*ck, "window_loss_steps");
  }
  const auto dropout_stream = state_value<uint64_t>(*ck, "dropout_stream");
  check_same_trained_parameters(*ck, count_value(*ck, "optimizer_steps"));
  load_optimizer_state(parts_, *ck, count_value(*ck, "optimizer_steps"));
  parts_.dropout_gen->set_state(dropout_stream);
  if (parts_.ema != nullptr) {
    // The average continues where the checkpoint left it; a checkpoint of a run without one starts it from the
    // resumed weights (the run then differs from one that averaged from the start, so say so).
    if (ck->ema.has_value() && s.contains("ema_updates")) {
      parts_.ema->load(ck->ema->tensors, count_value(*ck, "ema_updates"),
                       fmt::format("--resume: {}/ema.safetensors", ck->dir.string()));
    } else {
      parts_.ema->restart();
      spdlog::warn("--resume: {} holds no weight average (ema.safetensors): the average starts from the resumed "
                   "weights",
                   ck->dir.string());
    }
  }
  // The record of what the run started from goes on into its next checkpoints (Note [Provenance of a fine-tuned run]
  // in provenance.cpp).
  if (const auto it = ck->model.metadata.find(kInitFromKey); it != ck->model.metadata.end())
    o_.model_metadata[kInitFromKey] = it->second;
  resumed_from_ = ck->dir;
  repoint_best(st.best_checkpoint_step);
  spdlog::info("resumed from {} at step {} (epoch {}, batch {})", ck->dir.string(), st.step, st.position.epoch + 1,
               st.position.batch);
  return st;
}

// The loader's position (epoch, batch) and the data order (a function of the seed and the row count) name rows of the
// data the run trained on: under data with other rows, or the same number of other rows, a resume would continue
// on rows the run never planned (some twice, some never, some other text), so it is refused. A checkpoint that
// records neither (written before the state held them) is not checked.
void Checkpointer::check_same_data(const io::Checkpoint& ck) const {
  if (!ck.state.is_object()) return;
  const std::string fix = "restore the data the run trained on, or start a new run from its weights with model.init_from";
  if (ck.state.contains("train_rows")) {
    const int64_t rows = count_value(ck, "train_rows");
    HT_CHECK(rows == o_.train_rows,
             "--resume: the checkpoint {} was written training on {} rows, but this config's training data has {}: "
             "the data changed since (other files or text, or another split or sequence length), so the loader's "
             "position would name other rows; {}",
             ck.dir.string(), rows, o_.train_rows, fix);
  }
  if (ck.state.contains("train_digest") && o_.train_digest) {
    const auto recorded = state_value<std::string>(ck, "train_digest");
    const std::string now = fmt::format("{:016x}", *o_.train_digest);
    HT_CHECK(recorded == now,
             "--resume: the checkpoint {} was written training on other rows than this config's data gives (the rows' "
             "digest was {}, now {}; the same number, {}): a source file's text, the files or the tokenizer changed "
             "since; {}",
             ck.dir.string(), recorded, now, o_.train_rows, fix);
  }
}

// The optimiser's state covers the parameters the checkpoint's run trained. A parameter that trains now without
// state would start its moments from zero with the run's step count in AdamW's bias correction (its first updates
// about 3x too large), and state of a parameter that is frozen now would be dropped: train.freeze or model.lora
// differ from the run's. Checked when the checkpoint holds state at all (SGD without momentum keeps none).
void Checkpointer::check_same_trained_parameters(const io::Checkpoint& ck, int64_t optimizer_steps) const {
  if (!ck.optimizer || ck.optimizer->tensors.empty() || optimizer_steps == 0) return;
  const auto& slots = parts_.optimizer->store().state_names();
  if (slots.empty()) return;
  const std::string slot = "." + slots.front();  // every trained parameter has each slot; the first tells
  std::vector<std::string> new_now, frozen_now;
  std::set<std::string> trained;
  for (const auto& p : parts_.optimizer->params()) {
    if (!p.param->requires_grad()) continue;  // frozen: no gradient, no state
    trained.insert(p.name);
    if (!ck.optimizer->tensors.count(p.name + slot)) new_now.push_back(p.name);
  }
  for (const auto& [key, t] : ck.optimizer->tensors)
    if (key.size() > slot.size() && key.ends_with(slot))
      if (std::string name = key.substr(0, key.size() - slot.size()); !trained.count(name))
        frozen_now.push_back(std::move(name));
  const auto some = [](const std::vector<std::string>& names) { return first_names(names, 3, "'"); };
  const std::string fix = "resume with the run's train.freeze and model.lora, or start a new run from its weights with "
                          "model.init_from";
  HT_CHECK(new_now.empty(), "--resume: {} parameter(s) train under this config that the checkpoint {} kept frozen ({}): "
           "they have no optimiser state, and {} would start theirs at the run's step {}; {}",
           new_now.size(), ck.dir.string(), some(new_now), parts_.optimizer->name(), optimizer_steps, fix);
  HT_CHECK(frozen_now.empty(), "--resume: {} parameter(s) the checkpoint {} trained are frozen under this config ({}): "
           "their optimiser state would be dropped; {}",
           frozen_now.size(), ck.dir.string(), some(frozen_now), fix);
}

// Note [Best after a kill]
// A save with MarkBest::yes writes the checkpoint folder, then `latest`, then `best` (io::save_checkpoint); a
// checkpoint written again after an evaluation (Note [Step evaluations] in trainer.cpp) keeps its name, so `latest`
// already names it before the rewrite. A process stopped between those writes leaves `latest` naming a checkpoint
// whose state holds its evaluation's scores (a resume does not evaluate that step again) and `best` naming an older
// one, or none. So every checkpoint's state.json records the step `best` should name (best_checkpoint_step: the
// step of the last checkpoint written with MarkBest::yes), and a resume points `best` there when it names another
// checkpoint. A run's `best` then ends where the uninterrupted run's does, and pruning, which spares the checkpoint
// `best` names, spares that one (tests/fault/test_fault_kill_between_writes.cpp).
void Checkpointer::repoint_best(int64_t step) const {
  if (!o_.keep_best || step < 0 || !parts_.role.writer) return;
  const std::optional<int64_t> named = io::best_checkpoint_step(o_.dir);
  if (named == step) return;
  const fs::path dir = io::checkpoint_dir(o_.dir, step);
  if (const std::vector<int64_t> steps = io::list_checkpoints(o_.dir);
      std::find(steps.begin(), steps.end(), step) == steps.end()) {
    spdlog::warn("--resume: the best checkpoint recorded by the run, {}, is gone; `best` stays as it is", dir.string());
    return;
  }
  io::point_best_at(o_.dir, step);
  spdlog::info("--resume: {} pointed at {}; re-pointed at {}, the best checkpoint the run recorded (the previous "
               "process stopped before it wrote `best`)",
               (o_.dir / "best").string(), named ? io::checkpoint_dir(o_.dir, *named).string() : "nothing",
               dir.string());
}

std::string Checkpointer::last_good_checkpoint() const {
  const std::optional<int64_t> last = io::latest_checkpoint_step(o_.dir);
  return last ? fmt::format("the last good checkpoint is {}", io::checkpoint_dir(o_.dir, *last).string())
              : fmt::format("no checkpoint was written in {}", o_.dir.string());
}

fs::path Checkpointer::write(const RunState& st, io::MarkBest best, bool& diverged) {
  io::CheckpointData d;
  d.step = st.step;
  if (parts_.sharded && parts_.sharded->write_shards) {
    // A sharded checkpoint: every rank's shard file is durable before the writer publishes the step.
    d.adopt_files = parts_.sharded->write_shards(o_.dir / fmt::format("step_{}.shards.tmp", st.step), st.step);
    if (!parts_.role.writer) return {};
    d.model = to_list(parts_.sharded->unsharded());
  } else {
    if (!parts_.sharded && !parts_.role.writer) return {};  // ddp: the writer holds the same replica
    d.model = model_tensors(parts_);
    d.optimizer = optimizer_tensors(parts_);
    if (!parts_.role.writer) return {};  // fsdp: gathered with the writer; it writes
  }
  if (parts_.ema != nullptr) d.ema = to_list(parts_.ema->tensors());
  // A checkpoint is something to resume or evaluate from: one with non-finite weights is never written.
  if (const std::string bad = first_non_finite(d.model); !bad.empty()) {
    diverged = true;
    throw Error(fmt::format("the checkpoint of step {} was not written: the model's tensor {} (training diverged; "
                            "lower optim.lr); {}",
                            st.step, bad, last_good_checkpoint()));
  }
  d.model_metadata = o_.model_metadata;
  d.state = {{"step", st.step},
             {"epoch", st.position.epoch},
             {"batch", st.position.batch},
             {"best_" + o_.score_name, st.best_score},
             {"best_checkpoint_" + o_.score_name, st.best_checkpoint_score},
             {"epoch_loss_sum", st.epoch_loss},
             {"epoch_loss_steps", st.epoch_steps},
             {"window_loss_sum", st.window_loss},
             {"window_loss_steps", st.window_steps},
             {"dropout_stream", parts_.dropout_gen->state()},
             {"optimizer", parts_.optimizer->name()},
             {"optimizer_steps", parts_.optimizer->steps()},
             {"run", o_.run_name},
             {"seed", o_.seed},
             {"batch_size", o_.batch_size},
             {"train_rows", o_.train_rows}};
  if (st.best_checkpoint_step >= 0) d.state["best_checkpoint_step"] = st.best_checkpoint_step;
  if (o_.train_digest) d.state["train_digest"] = fmt::format("{:016x}", *o_.train_digest);
  if (parts_.ema != nullptr) d.state["ema_updates"] = parts_.ema->updates();
  const bool mark = best == io::MarkBest::yes && o_.keep_best;
  // io::save_checkpoint removes what it began when it fails, leaving `latest` and every earlier checkpoint as they
  // were.
  return io::save_checkpoint(o_.dir, d,
                             {.keep_last = o_.keep_last, .best = mark ? io::MarkBest::yes : io::MarkBest::no});
}

fs::path Checkpointer::save(const RunState& st, io::MarkBest best) {
  fs::path dir;
  std::string why;  // this rank's reason, when it did not write
  bool diverged = false;
  auto outcome = SaveOutcome::written;
  try {
    dir = write(st, best, diverged);
  } catch (const Error& e) {
    outcome = diverged ? SaveOutcome::diverged : SaveOutcome::failed;
    why = diverged ? e.what() : fmt::format("the checkpoint of step {} could not be written: {}", st.step, e.what());
  }
  if (parts_.role.outcomes) {
    // Every rank takes the course of the worst outcome, so none waits in a collective for a rank that stopped.
    const std::vector<int> all = parts_.role.outcomes(static_cast<int>(outcome));
    std::vector<int> bad;
    for (std::size_t r = 0; r < all.size(); ++r)
      if (all[r] > static_cast<int>(outcome)) bad.push_back(static_cast<int>(r));
    if (!bad.empty()) {
      outcome = static_cast<SaveOutcome>(*std::max_element(all.begin(), all.end()));
      why = fmt::format("the checkpoint of step {} was not written: rank(s) {} {} (their logs say why)", st.step,
                        fmt::join(bad, ", "),
                        outcome == SaveOutcome::diverged ? "found a non-finite model tensor" : "could not write");
    }
  }
  if (outcome == SaveOutcome::diverged) throw Error(why);
  if (outcome == SaveOutcome::failed) {
    const std::string what = fmt::format("{}; {}", why, last_good_checkpoint());
    if (!o_.continue_on_save_failure)
      throw Error(fmt::format("{}. Training stopped (checkpoint.on_save_failure is stop): free space or fix {} and "
                              "resume with --resume, or set checkpoint.on_save_failure=continue to train on when a save fails",
                              what, o_.dir.string()));
    spdlog::warn("{}; training goes on (checkpoint.on_save_failure is continue)", what);
    return {};
  }
  if (!parts_.role.writer) return io::checkpoint_dir(o_.dir, st.step);  // what the writer wrote
  spdlog::info("checkpoint written: {}", dir.string());
  return dir;
}

EvalWeights read_checkpoint_for_eval(const std::string& path) {
  const fs::path dir = io::resolve_checkpoint_pointer(path);  // checkpoints/best or latest: the step it names
  EvalWeights w;
  std::error_code ec;
  if (is_peft_folder(dir)) {
    // A PEFT adapter folder: its base's weights now, its adapters after the base (load_model_state_for_eval).
    const LlamaSource src = find_llama_source(dir);
    w.source = EvalSource::peft_folder;
    w.peft = read_peft_folder(dir);
    w.base = src.dir;
    w.ck.dir = dir;
    w.ck.step = 0;
    if (src.kind == LlamaSource::Kind::hf) {
      w.ck.model.tensors = models::read_hf_weights(src.dir).tensors;
    } else {
      io::Checkpoint base = io::load_checkpoint_dir(src.dir);
      dist::consolidate_checkpoint(base);
      w.ck.model.tensors = std::move(base.model.tensors);
    }
  } else if (fs::exists(dir / "config.json", ec) && !fs::exists(dir / "state.json", ec)) {
    // An HF folder holds the weights alone: no step of ours, so it reports step 0, as its conversion would be.
    w.source = EvalSource::hf_folder;
    w.ck.dir = dir;
    w.ck.step = 0;
    w.ck.model.tensors = models::read_hf_weights(dir).tensors;
  } else {
    std::optional<io::Checkpoint> ck;
    if (fs::exists(fs::path(dir) / "model.safetensors", ec)) ck = io::load_checkpoint_dir(dir);
    else ck = io::load_latest_checkpoint(dir);
    HT_CHECK(ck.has_value(), "--checkpoint: no checkpoint found in {}", dir.string());
    dist::consolidate_checkpoint(*ck);
    w.ck = std::move(*ck);
  }
  const std::string bad = first_non_finite(w.ck.model.tensors);
  HT_CHECK(bad.empty(), "--checkpoint: {} cannot be evaluated: its model tensor {}", w.ck.dir.string(), bad);
  return w;
}

void check_checkpoint_dir_usable(const fs::path& dir) {
  io::create_output_directory(dir, "checkpoint.dir");
  HT_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "checkpoint.dir: {} is not writable: {}", dir.string(),
           std::error_code(errno, std::generic_category()).message());
}

}  // namespace ht::train
