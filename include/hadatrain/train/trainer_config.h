// The typed config of `hadatrain train` / `hadatrain eval`: one struct per YAML section, each read by its own
// function with defaults and range checks (docs/config.md lists every key). Datasets: Fashion-MNIST, MNIST,
// CIFAR-10/100 and ImageNet-style JPEG folders; models: MLP, ResNet-18/34/50, ViT.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/data/rand_augment.h"
#include "hadatrain/data/text_data.h"
#include "hadatrain/dist/options.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/tensor/device.h"
#include "hadatrain/tensor/dtype.h"
#include "hadatrain/grad/pipeline.h"

namespace ht::train {

// run: what the run is called, where it writes, how it is seeded.
struct RunSection {
  std::string name;     // default: the config file's stem
  std::string out_dir;  // default: runs/<name>
  uint64_t seed = 0;    // seeds initialisation, data order, augmentation and dropout
};

enum class DatasetKind { fashion_mnist, mnist, cifar10, cifar100, image_folder, text, chat };
enum class AugmentKind { none, cifar, imagenet };
enum class CifarLabelKind { fine, coarse };

struct DataSection {
  DatasetKind dataset = DatasetKind::fashion_mnist;
  std::string root;  // IDX/CIFAR directory, or the folder holding train/ and val/ class folders
  int64_t batch_size = 64;
  int64_t eval_batch_size = 1000;
  int num_workers = 1;
  bool pin_memory = true;   // CUDA training: batches in page-locked memory, asynchronous copies
  // The first N samples of the training / test split only (0 = all); language-model data: the first N rows.
  int64_t train_limit = 0;
  int64_t test_limit = 0;
  CifarLabelKind label = CifarLabelKind::fine;
  AugmentKind augment = AugmentKind::none;
  int64_t image_size = 224;   // image_folder: training crop and evaluation crop
  int64_t eval_resize = 256;  // image_folder: shorter side before the evaluation center crop
  // Training images per epoch appear this many times in a row, each with its own augmentation
  // (data::LoaderOptions::repeats, Note [Repeated augmentation]); 1: off.
  int64_t repeated_augmentation = 1;
  std::vector<double> normalize_mean, normalize_std;  // per channel (one value = all channels)
  // dataset text | chat: language-model data (data/text_data.h); the image keys above do not apply. text.seq_len
  // is 0 in a config with model.init_from and no data.seq_len until the run sets it (set_default_seq_len).
  data::TextDataOptions text;
  // Bilinear resize of every image (train and test) to resize x resize before the augmentation, e.g. CIFAR at
  // 224 for a model pretrained on ImageNet (0 = keep the dataset's size).
  int64_t resize = 0;
  // Mixup / CutMix on training batches with soft-target cross-entropy (data/mix.h); off unless an alpha > 0.
  struct Mix {
    double mixup_alpha = 0.0, cutmix_alpha = 0.0, prob = 1.0, switch_prob = 0.5, label_smoothing = 0.1;
    std::string mode = "batch";  // batch | elem
    bool correct_lam = true;
    bool enabled() const { return mixup_alpha > 0 || cutmix_alpha > 0; }
  } mix;
  // RandAugment on training images after the augmentation above, before normalisation (data/rand_augment.h);
  // absent = off. A section, or timm's string ("rand-m9-mstd0.5-inc1").
  std::optional<data::RandAugmentOptions> rand_augment;
};

enum class ModelKind { mlp, resnet18, resnet34, resnet50, vit, llama };

struct ModelSection {
  ModelKind name = ModelKind::mlp;
  int64_t num_classes = 0;  // 0: from the dataset
  // Pretrained weights (train/init_from.h): a timm/torchvision safetensors file, a folder holding
  // model.safetensors (one of our checkpoints, or a model hub download), or "" to start from scratch.
  std::string init_from;
  std::vector<std::string> init_from_reset;  // tensors (glob patterns) not loaded from init_from, e.g. "fc.*"
  // mlp
  std::vector<int64_t> hidden{256, 128};
  std::string activation = "relu";
  // resnet
  std::string stem = "auto";  // cifar (3x3, no max-pool), imagenet (7x7 + max-pool), auto: by image size
  bool zero_init_residual = false;
  std::string channels_last = "auto";  // auto (channels last on CUDA, NCHW on the CPU), true, false
  std::string fusion = "bn_add_relu";  // none | bn_relu | bn_add_relu (models::ResNetFusion)
  // vit
  int64_t patch_size = 4, dim = 384, depth = 12, heads = 6;
  double mlp_ratio = 4.0;
  std::string pool = "token";  // token | mean
  double dropout = 0.0;
  double drop_path = 0.0;  // vit: stochastic depth, rising linearly over the blocks to this rate
  // llama (docs/language_models.md): model.preset with the model.llama.* keys applied (HF config.json names);
  // vocab_size 0 means the tokenizer's. With model.init_from the architecture is the source's instead.
  std::string preset = "tiny";
  models::LlamaConfig llama;
  bool activation_checkpointing = false;  // recompute each block in backward instead of keeping its activations
  std::optional<nn::LoraConfig> lora;     // model.lora with rank > 0
};

enum class OptimKind { sgd, adamw };

struct OptimSection {
  OptimKind name = OptimKind::sgd;
  double lr = 0.05;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool decay_norm_and_bias = false;  // weight decay also on 1-D parameters (biases, norm scales)
  double clip_grad_norm = 0.0;       // 0 = no clipping
  // (pattern, multiplier): the first pattern matching a parameter's name scales its learning rate
  // (optim/param_rules.h); a YAML map in document order.
  std::vector<std::pair<std::string, double>> lr_multipliers;
  // vit: layer-wise learning-rate decay (timm's layer_decay, BEiT / MAE fine-tuning): block i of n learns at
  // layer_decay^(n - i) x lr, the patch embedding, class token and position embedding at layer_decay^(n + 1), the
  // final norm and head at 1; multiplies lr_multipliers' scale. 1: off.
  double layer_decay = 1.0;
};

enum class ScheduleName { constant, step, multistep, cosine, cosine_restarts };

struct ScheduleSection {
  ScheduleName name = ScheduleName::constant;
  double warmup_epochs = 0.0;
  int64_t warmup_steps = 0;  // when > 0, the warm-up in optimiser steps (instead of warmup_epochs)
  double warmup_start_factor = 0.0;
  std::vector<double> milestones;  // multistep, in epochs
  double step_epochs = 30;         // step schedule period, in epochs
  double gamma = 0.1;
  double min_lr = 0.0;  // cosine floor
  double restart_epochs = 10;  // cosine_restarts: the first cycle, in epochs (PyTorch's T_0)
  int64_t restart_mult = 1;    // cosine_restarts: each cycle this many times the previous one (T_mult)
};

enum class Precision { fp32, bf16 };

struct TrainSection {
  int64_t epochs = 3;
  int64_t log_every = 100;
  int64_t max_steps = 0;  // stop after this many optimiser steps in total (0 = run all epochs)
  Device device = Device::cpu();
  DType dtype = DType::f32;            // master weights and optimiser state: f32 or f64
  Precision precision = Precision::fp32;  // forward compute dtype (bf16 casts activations and weights)
  double label_smoothing = 0.0;
  int64_t eval_every = 1;  // epochs between evaluations (the last epoch is always evaluated)
  // Also evaluate after every this many optimiser steps, counted from the run's start (0 = off); a step that ends
  // an epoch or the run is evaluated once, at that epoch's end.
  int64_t eval_every_steps = 0;
  bool tf32 = false;       // f32 matrix products on CUDA may use TF32 tensor cores (cuBLASLt)
  // Record the training step into a CUDA graph and replay it (cuda/graph.h): "auto" (on CUDA; steps run
  // eagerly when a step cannot be recorded), "true" (a refused recording is an error), "false".
  std::string cuda_graph = "auto";
  // Micro-batches per optimiser step: each batch of data.batch_size is split into this many, each run forward
  // and backward in turn, then one optimiser step (the whole batch's update with one micro-batch's activations).
  int64_t grad_accum_steps = 1;
  // The device's peak for the model FLOPs utilisation (mfu) logged by tasks that count their FLOPs (causal
  // LM): dense bf16 TFLOP/s; the default is the H200's (NVIDIA's data sheet, without sparsity).
  double peak_tflops = 989.0;
  // Parameters that do not train, by name pattern; the last matching pattern decides and "!pattern" undoes
  // a freeze: ["*", "!layer4.*", "!fc.*"] trains layer4 and fc only (optim/param_rules.h).
  std::vector<std::string> freeze;
};

struct CheckpointSection {
  int64_t every_epochs = 0;  // 0 = no epoch checkpoints
  int64_t every_steps = 0;   // 0 = no step checkpoints
  int keep_last = 2;
  bool keep_best = true;  // point `best` at the best-scoring checkpoint written at an evaluation
  std::string dir;        // default: <out_dir>/checkpoints
  // on_save_failure: stop (a failed save stops the run, naming the last good checkpoint) or continue (warn
  // and train on; the next save tries again).
  bool continue_on_save_failure = false;
  // dist.mode fsdp: every rank writes its own shard file into the step's folder (true), or the shards are
  // gathered and rank 0 writes a plain checkpoint (false). Other modes write plain checkpoints.
  bool sharded = true;
};

// `ema`: an exponential moving average of the trained weights (Note [Weight EMA] in src/train/ema.h), kept beside
// them, evaluated and checkpointed. Absent: none.
struct EmaSection {
  double decay = 0.9999;               // each update: average = decay * average + (1 - decay) * weights
  int64_t every_steps = 1;             // update after every this many optimiser steps
  bool restart_during_warmup = false;  // during the schedule's warm-up every update restarts the average
  bool evaluate = true;                // evaluate the average beside the weights (ema_* in metrics.jsonl)
};

struct TrainerConfig {
  RunSection run;
  DataSection data;
  ModelSection model;
  OptimSection optim;
  ScheduleSection schedule;
  TrainSection train;
  CheckpointSection checkpoint;
  grad::PipelineConfig grad_pipeline;  // train/pipeline_config.h; exact everywhere by default
  dist::DistOptions dist;              // dist/options.h; one process by default
  std::optional<EmaSection> ema;       // absent: no weight average
  std::string source;
  std::string resolved_yaml;
};

// Reads every section from `root`, rejects unknown keys and records the resolved YAML.
TrainerConfig read_trainer_config(ConfigReader root);
TrainerConfig load_trainer_config(const std::string& path, const std::vector<std::string>& overrides = {});

// data.seq_len when the config does not give it: the model's max_position_embeddings, at most 512
// (Note [data.seq_len's default] in trainer_config.cpp).
int64_t default_seq_len(int64_t max_position_embeddings);
// Sets the data.seq_len of a config read without one and with model.init_from (0 until the source's positions are
// read) to default_seq_len(max_position_embeddings), and records it in resolved_yaml.
void set_default_seq_len(TrainerConfig& c, int64_t max_position_embeddings);

std::string dataset_name(DatasetKind d);
std::string model_name(ModelKind m);

}  // namespace ht::train
