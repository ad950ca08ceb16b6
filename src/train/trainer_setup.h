// Construction helpers of the trainer (datasets, model, optimiser, schedule, task). Internal to src/train.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "hadatrain/data/dataset.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/data/text_dataset.h"
#include "hadatrain/data/transforms.h"
#include "hadatrain/nn/module.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/optim/param_rules.h"
#include "hadatrain/optim/schedule.h"
#include "hadatrain/train/init_from.h"
#include "hadatrain/train/task.h"
#include "hadatrain/train/trainer_config.h"

namespace ht::train {

struct Datasets {
  std::shared_ptr<const data::Dataset> train, test;  // images (null for language-model data)
  std::shared_ptr<const data::TextDataset> text_train, text_test;  // data.dataset text | chat
  int64_t vocab_size = 0;                                          // the tokenizer's, for text data
  std::string tokenizer_fingerprint;  // data::Tokenizer::fingerprint() of data.tokenizer, for text data
  // The tokenizer's begin and end ids (text data), which a LLaMA built from a preset records as its
  // bos_token_id / eos_token_id (generate stops at those): its end of text, and for chat data its end of turn too.
  std::optional<int64_t> bos_id;
  std::vector<int64_t> eos_ids;
  std::string chat_format;  // chat data: the template the rows were made with ("llama3" | "llama2"), else ""
  int64_t num_classes = 0;
  int64_t channels = 0, height = 0, width = 0;  // of the images the model sees
};

enum class Split { train, test };
Datasets make_datasets(const TrainerConfig& cfg);
data::Normalize make_normalize(const DataSection& d, int64_t channels);
// What the model's weights start from: model.init_from's (or the initialiser's), or nothing worth reading
// because a checkpoint's replace them (a resumed run: model.init_from then gives a LLaMA's architecture only).
// make_model applies model.init_from for InitWeights::read (the report's lines logged), for every model kind.
enum class InitWeights { read, replaced_by_checkpoint };
// model.init_from resolved once (Note [model.init_from resolved once] in trainer_setup.cpp): nullopt when unset, and
// for models other than a LLaMA when `weights` says a checkpoint's replace it (it is not read then, and need not
// exist any more).
std::optional<InitFromSource> resolve_init_from(const TrainerConfig& cfg, InitWeights weights);
struct ModelStart {
  InitWeights weights = InitWeights::read;
  // cfg.model.init_from resolved by the caller, which records it (a new run's checkpoints); null: make_model
  // resolves it itself (eval, inspect-grads: nothing is recorded).
  const InitFromSource* init_from = nullptr;
};
std::shared_ptr<nn::Module> make_model(const TrainerConfig& cfg, const Datasets& ds, Generator& init_gen,
                                       std::shared_ptr<Generator> dropout_gen, const ModelStart& start = {});
// `shard`, when given, turns the model's store into the one the optimiser steps (dist.mode fsdp: the store
// of this rank's master shards).
using StoreWrap = std::function<std::shared_ptr<nn::ParameterStore>(std::shared_ptr<nn::ParameterStore>)>;
// train.freeze's rules, after model.lora's (everything but the adapters frozen) when LoRA is on.
optim::FreezeRules freeze_rules(const TrainerConfig& cfg);
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainerConfig& cfg, nn::Module& model,
                                                 const StoreWrap& shard = {});
optim::ScheduleConfig make_schedule(const TrainerConfig& cfg, int64_t steps_per_epoch);
data::LoaderOptions loader_options(const TrainerConfig& cfg, const Datasets& ds, Split split);
// The forward compute dtype: bf16 with precision bf16, else the master dtype.
DType compute_dtype(const TrainerConfig& cfg);
// True for a ResNet laid out channels last: model.channels_last true, or auto on a CUDA device.
bool resnet_channels_last(const TrainerConfig& cfg);
// The task the config trains: image classification with the compute dtype and train.label_smoothing, or
// causal language modelling for model.name llama (its FLOPs counted from `model`).
std::unique_ptr<Task> make_task(const TrainerConfig& cfg, nn::Module& model);
// The batches of one split: the image loader, or the text loader for data.dataset text | chat.
// `slice_index` of `slice_count` > 1: an image loader makes only that slice of each batch (data-parallel ranks,
// Note [Sliced batches] in data/loader.cpp); text batches are always whole. `min_last_batch`: the epoch's last
// batch is dropped when it has fewer rows (data-parallel training: the world size, as every rank needs a row).
std::unique_ptr<class BatchSource> make_loader(const TrainerConfig& cfg, const Datasets& ds, Split split,
                                               int slice_index = 0, int slice_count = 1, int64_t min_last_batch = 1);
// "fashion_mnist (60000 train / 10000 test samples, 10 classes)", "text (1200 train / 60 validation rows of
// 512 tokens, vocabulary 32000)".
std::string describe_data(const TrainerConfig& cfg, const Datasets& ds);
// Throws a clear error when train.device names a CUDA device that is not there.
void check_device(Device device);

}  // namespace ht::train
