// The language-model parts of the trainer's setup (model.name llama, data.dataset text | chat): the model
// from a preset, model.llama.* keys or model.init_from (an HF folder or one of our checkpoints), LoRA and
// activation checkpointing, the text datasets and loaders, the causal-LM task, and what an LM checkpoint
// records about its model. Internal to src/train; tools/hadatrain's generate and convert read the same
// records (docs/language_models.md).
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "hadatrain/data/tokenizer.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/task.h"
#include "hadatrain/train/trainer_config.h"
#include "batch_source.h"
#include "trainer_setup.h"

namespace ht::train {

// The text datasets of data.dataset text | chat, with the tokenizer's vocabulary size.
void make_text_datasets(const TrainerConfig& cfg, Datasets& ds);

// `cfg` with data.seq_len set when the config left it to model.init_from's source (Note [data.seq_len's default] in
// trainer_config.cpp): the source's max_position_embeddings, from `init_from` (resolve_init_from's) when given, else
// read from the source. Otherwise `cfg` as it is.
TrainerConfig with_source_seq_len(TrainerConfig cfg, const InitFromSource* init_from = nullptr);

// model.name llama (Note [LM model sources] in causal_lm_setup.cpp), from start.init_from (model.init_from resolved,
// required when the config sets it). InitWeights::replaced_by_checkpoint: its architecture without reading its weights.
std::shared_ptr<nn::Module> make_llama(const TrainerConfig& cfg, const Datasets& ds, Generator& init_gen,
                                       std::shared_ptr<Generator> dropout_gen, const ModelStart& start);

// train.precision bf16 on a Llama: freezes what the freeze rules freeze (freeze_rules: the LoRA base,
// train.freeze's patterns; make_optimizer applies the same rules again) and holds the frozen matrices in bf16
// from now on instead of as f32 masters cast in every step (Note [Frozen base in the compute dtype],
// nn/lora.h). Called after the model's last Module::to(dtype) (which would make them f32 again) and before it
// moves to its device, so the device never holds the f32 base; a no-op for other models and precisions.
void store_frozen_in_compute_dtype(const TrainerConfig& cfg, nn::Module& model);

// The causal-LM task for `model` (a models::Llama): next-token labels as the text loader makes them, and the
// model's training FLOPs per token at data.seq_len.
std::unique_ptr<Task> make_causal_lm_task(const TrainerConfig& cfg, nn::Module& model);

// The text loader of one split as a BatchSource.
std::unique_ptr<BatchSource> make_text_loader(const TrainerConfig& cfg, const Datasets& ds, Split split,
                                              int64_t min_last_batch = 1);

// What an LM checkpoint records about its model and tokenizer (train/lm_source.h's keys); empty for other models.
// What a run started from (kInitFromKey) is the trainer's to add, for every model (init_from_record).
io::Metadata lm_checkpoint_metadata(const TrainerConfig& cfg, const Datasets& ds, nn::Module& model);

}  // namespace ht::train
