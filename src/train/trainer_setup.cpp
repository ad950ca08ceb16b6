// Builds the trainer's pieces from the config: datasets with their transforms, the model, the optimiser
// with its weight-decay groups, the schedule converted from epochs to steps, and the task.
#include "trainer_setup.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "hadatrain/data/cifar.h"
#include "hadatrain/data/image_folder.h"
#include "hadatrain/data/mix.h"
#include "hadatrain/data/mnist.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/optim/param_rules.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/train/init_from.h"
#include "hadatrain/train/image_classification.h"
#include "causal_lm_setup.h"

namespace ht::train {
namespace {

// The first `limit` samples of a dataset (0 = all).
class Prefix final : public data::Dataset {
 public:
  Prefix(std::shared_ptr<const data::Dataset> base, int64_t limit)
      : base_(std::move(base)), n_(limit > 0 ? std::min(limit, base_->size()) : base_->size()) {}
  int64_t size() const override { return n_; }
  data::Sample get(int64_t i, data::SampleRng& rng) const override { return base_->get(i, rng); }
  std::string describe_sample(int64_t i) const override { return base_->describe_sample(i); }

 private:
  std::shared_ptr<const data::Dataset> base_;
  int64_t n_;
};

std::shared_ptr<const data::Dataset> limited(std::shared_ptr<const data::Dataset> d, int64_t limit) {
  return limit > 0 ? std::make_shared<const Prefix>(std::move(d), limit) : d;
}

void check_dir(const std::string& dir, const DataSection& d) {
  std::error_code ec;
  HT_CHECK(std::filesystem::is_directory(dir, ec),
           "data.root: {} is not a directory ({}; see docs/data.md for where {} files come from)", dir,
           d.dataset == DatasetKind::fashion_mnist ? "tools/setup.sh installs Fashion-MNIST into "
                                                     "/usr/share/datasets/fashion-mnist"
                                                   : "point data.root at your copy",
           dataset_name(d.dataset));
}

}  // namespace

data::Normalize make_normalize(const DataSection& d, int64_t channels) {
  data::Normalize n;
  for (int64_t c = 0; c < channels; ++c) {
    const std::size_t k = d.normalize_mean.size() == 1 ? 0 : static_cast<std::size_t>(c);
    HT_CHECK(k < d.normalize_mean.size(), "data.normalize: {} values for images with {} channels",
             d.normalize_mean.size(), channels);
    n.mean.push_back(static_cast<float>(d.normalize_mean[k]));
    n.std.push_back(static_cast<float>(d.normalize_std[k]));
  }
  return n;
}

Datasets make_datasets(const TrainerConfig& cfg) {
  const DataSection& d = cfg.data;
  Datasets ds;
  const bool text = d.dataset == DatasetKind::text || d.dataset == DatasetKind::chat;
  HT_CHECK(text == (cfg.model.name == ModelKind::llama),
           "data.dataset {} and model.name {} do not go together: a language model (llama) trains on text or chat "
           "data, the other models on images",
           dataset_name(d.dataset), model_name(cfg.model.name));
  if (text) {
    make_text_datasets(cfg, ds);
    return ds;
  }
  std::shared_ptr<const data::Dataset> train, test;
  switch (d.dataset) {
    case DatasetKind::fashion_mnist:
    case DatasetKind::mnist: {
      check_dir(d.root, d);
      auto tr = std::make_shared<const data::MnistData>(data::load_mnist(d.root, data::MnistSplit::train, d.train_limit));
      auto te = std::make_shared<const data::MnistData>(data::load_mnist(d.root, data::MnistSplit::test, d.test_limit));
      train = std::make_shared<const data::MnistDataset>(tr);
      test = std::make_shared<const data::MnistDataset>(te);
      ds.num_classes = data::kMnistClasses;
      ds.channels = tr->images.size(1);
      ds.height = tr->images.size(2);
      ds.width = tr->images.size(3);
      break;
    }
    case DatasetKind::cifar10:
    case DatasetKind::cifar100: {
      check_dir(d.root, d);
      data::CifarOptions o;
      o.variant = d.dataset == DatasetKind::cifar10 ? data::CifarVariant::cifar10 : data::CifarVariant::cifar100;
      o.label = d.label == CifarLabelKind::coarse ? data::CifarLabel::coarse : data::CifarLabel::fine;
      o.split = data::CifarSplit::train;
      auto tr = std::make_shared<const data::CifarDataset>(d.root, o);
      o.split = data::CifarSplit::test;
      auto te = std::make_shared<const data::CifarDataset>(d.root, o);
      ds.num_classes = tr->data().num_classes();
      train = limited(tr, d.train_limit);
      test = limited(te, d.test_limit);
      ds.channels = 3;
      ds.height = ds.width = data::kCifarSide;
      break;
    }
    case DatasetKind::image_folder: {
      const auto root = std::filesystem::path(d.root);
      check_dir((root / "train").string(), d);
      check_dir((root / "val").string(), d);
      data::ImageFolderOptions o;
      o.root = root / "train";
      auto tr = std::make_shared<const data::ImageFolder>(o);
      data::ImageFolderOptions ov;
      ov.root = root / "val";
      ov.classes = tr->classes();  // the validation labels follow the training class order
      auto te = std::make_shared<const data::ImageFolder>(ov);
      ds.num_classes = static_cast<int64_t>(tr->classes().size());
      train = limited(tr, d.train_limit);
      test = limited(te, d.test_limit);
      ds.channels = 3;
      ds.height = ds.width = d.image_size;
      break;
    }
    case DatasetKind::text:
    case DatasetKind::chat:  // language-model data: data::make_text_datasets (data/text_data.h)
      HT_FAIL("data.dataset: {} is language-model data; it trains a language model, not model.name {}",
              dataset_name(d.dataset), model_name(cfg.model.name));
  }
  if (d.resize > 0) {
    const data::Transform up = data::resize_transform(d.resize, d.resize);
    train = data::with_transform(train, up);
    test = data::with_transform(test, up);
    ds.height = ds.width = d.resize;
  }
  switch (d.augment) {
    case AugmentKind::none:  // not with image_folder (a config error): its images differ in size
      break;
    case AugmentKind::cifar:
      train = data::with_transform(train, data::compose({data::random_crop_transform({ds.height, ds.width, 4}),
                                                          data::random_hflip_transform(0.5f)}));
      break;
    case AugmentKind::imagenet:
      train = data::with_transform(train, data::imagenet_train_transform(d.image_size));
      break;
  }
  if (d.rand_augment) {
    // After the crop and flip, before normalisation (torchvision's classification recipe), drawing from the
    // same sample stream after them. Its fill has one value or one per channel (read_data checks it).
    train = data::with_transform(train, data::rand_augment_transform(*d.rand_augment));
  }
  if (d.dataset == DatasetKind::image_folder)
    test = data::with_transform(test, data::imagenet_eval_transform(d.eval_resize, d.image_size));
  ds.train = train;
  ds.test = test;
  if (cfg.model.num_classes > 0) ds.num_classes = cfg.model.num_classes;
  return ds;
}

namespace {

// The model of cfg.model, its weights from the initialiser (a LLaMA reads model.init_from, start.init_from, itself
// when start.weights says so: its architecture comes from there).
std::shared_ptr<nn::Module> build_model(const TrainerConfig& cfg, const Datasets& ds, Generator& gen,
                                        std::shared_ptr<Generator> dropout_gen, const ModelStart& start) {
  const ModelSection& m = cfg.model;
  switch (m.name) {
    case ModelKind::mlp: {
      auto seq = std::make_shared<nn::Sequential>();
      seq->push_back(std::make_shared<nn::Flatten>(1));  // (B, C, H, W) -> (B, C*H*W)
      std::vector<int64_t> widths{ds.channels * ds.height * ds.width};
      widths.insert(widths.end(), m.hidden.begin(), m.hidden.end());
      widths.push_back(ds.num_classes);
      for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
        seq->push_back(std::make_shared<nn::Linear>(widths[l], widths[l + 1], nn::Bias::yes, gen));
        if (l + 2 < widths.size()) seq->push_back(std::make_shared<nn::Activation>(nn::activation_from_name(m.activation)));
      }
      return seq;
    }
    case ModelKind::resnet18:
    case ModelKind::resnet34:
    case ModelKind::resnet50: {
      models::ResNetConfig rc;
      rc.depth = models::resnet_depth_from_name(model_name(m.name));
      const bool small = ds.height <= 64;
      rc.stem = m.stem == "imagenet" || (m.stem == "auto" && !small) ? models::ResNetStem::imagenet
                                                                      : models::ResNetStem::cifar;
      rc.num_classes = ds.num_classes;
      rc.in_channels = ds.channels;
      rc.zero_init_residual = m.zero_init_residual;
      rc.layout = resnet_channels_last(cfg) ? ConvLayout::nhwc : ConvLayout::nchw;
      rc.fusion = m.fusion == "none"      ? models::ResNetFusion::none
                  : m.fusion == "bn_relu" ? models::ResNetFusion::bn_relu
                                          : models::ResNetFusion::bn_add_relu;
      return std::make_shared<models::ResNet>(rc, gen);
    }
    case ModelKind::llama: return make_llama(cfg, ds, gen, std::move(dropout_gen), start);
    case ModelKind::vit: {
      HT_CHECK(ds.height == ds.width, "model vit: images must be square, got {}x{}", ds.height, ds.width);
      models::VitConfig vc;
      vc.image_size = ds.height;
      vc.patch_size = m.patch_size;
      vc.in_channels = ds.channels;
      vc.dim = m.dim;
      vc.depth = m.depth;
      vc.heads = m.heads;
      vc.mlp_ratio = m.mlp_ratio;
      vc.num_classes = ds.num_classes;
      vc.pool = m.pool == "mean" ? models::VitPool::mean : models::VitPool::class_token;
      vc.dropout = m.dropout;
      vc.drop_path = m.drop_path;
      return std::make_shared<models::VisionTransformer>(vc, gen, std::move(dropout_gen));
    }
  }
  HT_FAIL("unknown model");
}

}  // namespace

// Note [model.init_from resolved once]
// model.init_from may name a checkpoint root (or its `latest` file), whose `latest` another run moves on as it writes.
// A run reads it once: resolve_init_from turns it into the step_<N> folder (or file, or HF folder) named now, and the
// model is built from that (make_model), data.seq_len's default is its positions (with_source_seq_len), and a new
// run's checkpoints record that (init_from_record), so the record names the weights loaded, never a step written
// after them. For a LLaMA the source's model.safetensors header (its
// architecture, tokenizer and records) is read once too.
std::optional<InitFromSource> resolve_init_from(const TrainerConfig& cfg, InitWeights weights) {
  if (cfg.model.init_from.empty()) return std::nullopt;
  if (cfg.model.name != ModelKind::llama && weights != InitWeights::read) return std::nullopt;
  InitFromSource s;
  s.value = cfg.model.init_from;
  if (cfg.model.name == ModelKind::llama) {
    s.llama = find_llama_source(cfg.model.init_from);
    s.path = s.llama->dir;
  } else {
    s.path = resolve_pretrained(cfg.model.init_from);
  }
  return s;
}

std::shared_ptr<nn::Module> make_model(const TrainerConfig& cfg, const Datasets& ds, Generator& gen,
                                       std::shared_ptr<Generator> dropout_gen, const ModelStart& start) {
  std::optional<InitFromSource> resolved;
  ModelStart s = start;
  if (s.init_from == nullptr && (resolved = resolve_init_from(cfg, s.weights))) s.init_from = &*resolved;
  HT_ASSERT(s.init_from == nullptr || (s.init_from->value == cfg.model.init_from &&
                                       s.init_from->llama.has_value() == (cfg.model.name == ModelKind::llama)),
            "make_model: the resolved model.init_from is not the config's");
  auto model = build_model(cfg, ds, gen, std::move(dropout_gen), s);
  if (s.weights == InitWeights::read && s.init_from != nullptr && cfg.model.name != ModelKind::llama)
    for (const std::string& line : init_from_path(*model, s.init_from->path, {cfg.model.init_from_reset}).lines())
      spdlog::info("{}", line);
  return model;
}

optim::FreezeRules freeze_rules(const TrainerConfig& cfg) {
  optim::FreezeRules freeze{cfg.train.freeze};
  // model.lora: everything but the adapters is frozen, as peft does; train.freeze's patterns come after these,
  // so "!model.norm.*" there trains the final norm too.
  if (cfg.model.lora) freeze.patterns.insert(freeze.patterns.begin(), {"*", "!*.lora_A.*", "!*.lora_B.*"});
  return freeze;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainerConfig& cfg, nn::Module& model, const StoreWrap& shard) {
  const OptimSection& o = cfg.optim;
  auto params = optim::make_param_refs(model.named_parameters(), {"pos_embed", "cls_token"});
  if (o.decay_norm_and_bias)
    for (auto& p : params) p.decay = true;
  const optim::ParamRulesReport rules =
      optim::apply_param_rules(params, freeze_rules(cfg), optim::LrMultipliers(o.lr_multipliers));
  if (rules.frozen_params > 0)
    spdlog::info("train.freeze: {} parameter(s) ({} elements) frozen, {} ({} elements) train", rules.frozen_params,
                 rules.frozen_elements, rules.trainable_params, rules.trainable_elements);
  for (const auto& [name, scale] : rules.scaled) spdlog::info("optim.lr_multipliers: {} learns at {:g} x lr", name, scale);
  if (o.layer_decay != 1.0) {  // vit only (read_trainer_config)
    const int64_t depth = cfg.model.depth;
    for (auto& p : params)
      p.lr_scale *= std::pow(o.layer_decay, static_cast<double>(depth + 1 - models::vit_layer_id(p.name, depth)));
    spdlog::info("optim.layer_decay {:g}: the patch embedding learns at {:.4g} x lr, blocks.0 at {:.4g}, blocks.{} at "
                 "{:.4g}, the final norm and head at 1 (each times its optim.lr_multipliers scale)",
                 o.layer_decay, std::pow(o.layer_decay, depth + 1.0),
                 std::pow(o.layer_decay, static_cast<double>(depth)),
                 depth - 1, o.layer_decay);
  }
  auto store = nn::ParameterStore::attach(model, std::move(params));
  if (shard) store = shard(std::move(store));
  if (o.name == OptimKind::sgd)
    return optim::make_sgd(std::move(store),
                           {.momentum = o.momentum, .dampening = 0.0, .weight_decay = o.weight_decay, .nesterov = o.nesterov});
  return optim::make_adamw(std::move(store),
                           {.beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay});
}

optim::ScheduleConfig make_schedule(const TrainerConfig& cfg, int64_t spe) {
  const ScheduleSection& s = cfg.schedule;
  auto steps = [&](double epochs) { return static_cast<int64_t>(std::llround(epochs * static_cast<double>(spe))); };
  optim::ScheduleConfig c;
  c.base_lr = cfg.optim.lr;
  c.warmup_steps = s.warmup_steps > 0 ? s.warmup_steps : steps(s.warmup_epochs);
  c.warmup_start_factor = s.warmup_start_factor;
  // The cosine ends where the run ends: at train.max_steps when that comes before the last epoch's end.
  c.total_steps = cfg.train.max_steps > 0 ? std::min(cfg.train.max_steps, cfg.train.epochs * spe) : cfg.train.epochs * spe;
  c.min_lr = s.min_lr;
  c.gamma = s.gamma;
  switch (s.name) {
    case ScheduleName::constant: c.kind = optim::ScheduleKind::constant; break;
    case ScheduleName::step:
      c.kind = optim::ScheduleKind::step;
      c.step_size = std::max<int64_t>(1, steps(s.step_epochs));
      break;
    case ScheduleName::multistep:
      c.kind = optim::ScheduleKind::multistep;
      for (double e : s.milestones) c.milestones.push_back(steps(e));
      break;
    case ScheduleName::cosine: c.kind = optim::ScheduleKind::cosine; break;
    case ScheduleName::cosine_restarts:
      c.kind = optim::ScheduleKind::cosine_restarts;
      c.restart_steps = std::max<int64_t>(1, steps(s.restart_epochs));
      c.restart_mult = s.restart_mult;
      break;
  }
  return c;
}

void check_device(Device device) {
  if (!device.is_cuda()) return;
  const std::string what = fmt::format("train.device={}", to_string(device));
  require_cuda(what.c_str());
  const int count = cuda_device_count();
  HT_CHECK(device.index < count, "{}: only {} CUDA device(s) are visible", what, count);
}

std::unique_ptr<Task> make_task(const TrainerConfig& cfg, nn::Module& model) {
  if (cfg.model.name == ModelKind::llama) return make_causal_lm_task(cfg, model);
  return std::make_unique<ImageClassification>(
      ImageClassificationOptions{.compute_dtype = compute_dtype(cfg),
                                 .label_smoothing = cfg.train.label_smoothing,
                                 .channels_last = resnet_channels_last(cfg)});
}

bool resnet_channels_last(const TrainerConfig& cfg) {
  const ModelKind k = cfg.model.name;
  if (k != ModelKind::resnet18 && k != ModelKind::resnet34 && k != ModelKind::resnet50) return false;
  return cfg.model.channels_last == "true" || (cfg.model.channels_last == "auto" && cfg.train.device.is_cuda());
}

DType compute_dtype(const TrainerConfig& cfg) {
  return cfg.train.precision == Precision::bf16 ? DType::bf16 : cfg.train.dtype;
}

data::LoaderOptions loader_options(const TrainerConfig& cfg, const Datasets& ds, Split split) {
  data::LoaderOptions o;
  o.batch_size = split == Split::train ? cfg.data.batch_size : cfg.data.eval_batch_size;
  o.num_workers = cfg.data.num_workers;
  o.prefetch = std::max(4, 2 * cfg.data.num_workers);
  o.seed = cfg.run.seed;
  o.shuffle = split == Split::train ? data::Shuffle::on : data::Shuffle::off;
  o.repeats = split == Split::train ? cfg.data.repeated_augmentation : 1;
  o.drop_last = data::DropLast::no;
  o.normalize = make_normalize(cfg.data, ds.channels);
  o.pin_memory = cfg.data.pin_memory && cfg.train.device.is_cuda();  // Note [Pinned batches]
  if (o.pin_memory) o.pin_device = cfg.train.device;
  if (split == Split::train && cfg.data.mix.enabled()) {
    const DataSection::Mix& m = cfg.data.mix;
    const data::MixOptions mo{.mixup_alpha = m.mixup_alpha,
                              .cutmix_alpha = m.cutmix_alpha,
                              .prob = m.prob,
                              .switch_prob = m.switch_prob,
                              .label_smoothing = m.label_smoothing,
                              .mode = m.mode == "elem" ? data::MixMode::elem : data::MixMode::batch,
                              .correct_lam = m.correct_lam,
                              .num_classes = ds.num_classes,
                              .seed = cfg.run.seed};
    o.batch_transform = [mo](data::Batch& b) { data::mix_batch(b, mo); };
  }
  return o;
}

std::unique_ptr<BatchSource> make_loader(const TrainerConfig& cfg, const Datasets& ds, Split split, int slice_index,
                                         int slice_count, int64_t min_last_batch) {
  if (ds.text_train) {
    HT_ASSERT(slice_count == 1, "make_loader: text batches are made whole");
    return make_text_loader(cfg, ds, split, min_last_batch);
  }
  data::LoaderOptions o = loader_options(cfg, ds, split);
  o.slice_index = slice_index;
  o.slice_count = slice_count;
  o.min_last_batch = min_last_batch;
  return std::make_unique<LoaderSource<data::DataLoader>>(split == Split::train ? ds.train : ds.test, o);
}

std::string describe_data(const TrainerConfig& cfg, const Datasets& ds) {
  if (ds.text_train)
    return fmt::format("{} ({} train / {} validation rows of {} tokens, vocabulary {})", dataset_name(cfg.data.dataset),
                       ds.text_train->size(), ds.text_test->size(), ds.text_train->seq_len(), ds.vocab_size);
  return fmt::format("{} ({} train / {} test samples, {} classes)", dataset_name(cfg.data.dataset), ds.train->size(),
                     ds.test->size(), ds.num_classes);
}

}  // namespace ht::train
