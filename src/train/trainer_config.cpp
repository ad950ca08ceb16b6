// Section readers of the trainer config: defaults depend on the dataset (normalisation, augmentation,
// classes) so a short config is complete; every value is range-checked with file:line:key errors.
#include "hadatrain/train/trainer_config.h"
#include "hadatrain/train/pipeline_config.h"

#include <filesystem>
#include <initializer_list>

#include <spdlog/spdlog.h>

#include "hadatrain/core/logging.h"

namespace ht::train {
namespace {

bool is_mnist(DatasetKind d) { return d == DatasetKind::fashion_mnist || d == DatasetKind::mnist; }
bool is_cifar(DatasetKind d) { return d == DatasetKind::cifar10 || d == DatasetKind::cifar100; }

// data.dataset text | chat: the language-model keys (data/text_data.h); none of the image keys apply.
DataSection read_text_data(ConfigReader r, DataSection s) {
  data::TextDataOptions& t = s.text;
  const bool chat = s.dataset == DatasetKind::chat;
  t.kind = chat ? data::TextKind::chat : data::TextKind::text;
  t.paths = r.get_list<std::string>("paths", {});
  if (t.paths.empty()) r.fail("paths", chat ? "expected a list of JSONL files, folders or glob patterns"
                                            : "expected a list of text files, folders or glob patterns");
  t.val_paths = r.get_list<std::string>("val_paths", {});
  if (t.val_paths.empty()) {
    t.val_fraction = r.get("val_fraction", 0.05, Range::half_open(0.0, 1.0));
    if (t.val_fraction == 0.0)
      r.fail("val_fraction", "a language-model run needs validation text: give a share in (0, 1) here, or "
                             "data.val_paths");
  } else {
    r.reject("val_fraction", "does not apply with data.val_paths, which give the validation text; remove one of them");
    t.val_fraction = 0.0;
  }
  t.tokenizer = r.get<std::string>("tokenizer", "");
  if (t.tokenizer.empty()) r.fail("tokenizer", "expected a tokenizer file or folder (tokenizer.model, tokenizer.json)");
  // Absent: 0 until the model's positions are known (Note [data.seq_len's default]).
  t.seq_len = r.has("seq_len") ? r.get<int64_t>("seq_len", 0, Range::at_least(2)) : 0;
  t.cache_dir = r.get<std::string>("cache_dir", "");
  t.extensions = r.get_list<std::string>("extensions", {chat ? ".jsonl" : ".txt"});
  if (chat) {
    t.layout = r.get_choice("layout", data::ChatLayout::pad, {{"pad", data::ChatLayout::pad}, {"pack", data::ChatLayout::pack}});
    const std::string format = r.get_enum("chat_format", "auto", {"auto", "llama3", "llama2"});
    t.chat_format = format == "auto" ? "" : format;
  }
  t.num_threads = r.get("tokenize_threads", 0, Range::closed(0, 256));
  s.batch_size = r.get<int64_t>("batch_size", 8, Range::at_least(1));
  s.eval_batch_size = r.get<int64_t>("eval_batch_size", 8, Range::at_least(1));
  s.pin_memory = r.get("pin_memory", true);
  // The first N rows of each split (windows of seq_len tokens, or chat examples / packed rows), as for images.
  s.train_limit = r.get<int64_t>("train_limit", 0, Range::non_negative());
  s.test_limit = r.get<int64_t>("test_limit", 0, Range::non_negative());
  return s;
}

RunSection read_run(ConfigReader r, const std::string& default_name) {
  RunSection s;
  s.name = r.get<std::string>("name", default_name);
  if (s.name.empty() || s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
                            std::string::npos)
    r.fail("name", fmt::format("expected a non-empty name of letters, digits, '.', '_' or '-', got '{}'", s.name));
  s.out_dir = r.get<std::string>("out_dir", "runs/" + s.name);
  if (s.out_dir.empty()) r.fail("out_dir", "expected a directory path, got an empty string");
  s.seed = r.get<uint64_t>("seed", 0);
  return s;
}

// data.rand_augment: timm's string, or a section whose policy sets the other keys' defaults. `channels`: the images'.
std::optional<data::RandAugmentOptions> read_rand_augment(ConfigReader& r, std::size_t channels) {
  const std::string key = "rand_augment";
  if (!r.has(key)) return std::nullopt;
  data::RandAugmentOptions o;
  if (!r.holds_section(key)) {
    const std::string spec = r.get<std::string>(key, "");
    try {
      o = data::parse_rand_augment(spec);
    } catch (const Error& e) {
      r.fail(key, e.what());
    }
    return o;
  }
  ConfigReader ra = r.child(key);
  const auto policy = ra.get_choice("policy", data::RandAugmentPolicy::timm,
                                    {{"timm", data::RandAugmentPolicy::timm},
                                     {"torchvision", data::RandAugmentPolicy::torchvision}});
  const bool timm = policy == data::RandAugmentPolicy::timm;
  o = timm ? data::RandAugmentOptions::timm_defaults() : data::RandAugmentOptions::torchvision_defaults();
  if (timm) {
    o.increasing = ra.get("increasing", o.increasing);
    ra.reject("num_magnitude_bins", "applies to policy torchvision only");
  } else {
    o.num_magnitude_bins = ra.get("num_magnitude_bins", o.num_magnitude_bins, Range::at_least(2));
    ra.reject("increasing", "applies to policy timm only (torchvision's ops are fixed)");
  }
  o.num_ops = ra.get("num_ops", o.num_ops, Range::closed(1, 64));
  o.magnitude = ra.get("magnitude", o.magnitude, Range::closed(0.0, o.max_magnitude()));
  o.magnitude_std = ra.get("magnitude_std", o.magnitude_std, Range::non_negative());
  o.prob = ra.get("prob", o.prob, Range::closed(0.0, 1.0));
  o.warp.resample = ra.get_choice("interpolation", data::Resample::bilinear,
                                  {{"bilinear", data::Resample::bilinear}, {"nearest", data::Resample::nearest}});
  for (int64_t v : ra.get_list<int64_t>("fill", {0}, Range::closed(0, 255)))
    o.warp.fill.push_back(static_cast<uint8_t>(v));
  if (o.warp.fill.size() != 1 && o.warp.fill.size() != channels)
    ra.fail("fill", fmt::format("expected one value, or one per channel ({}), got {}", channels, o.warp.fill.size()));
  return o;
}

DataSection read_data(ConfigReader r) {
  DataSection s;
  s.dataset = r.get_choice("dataset", DatasetKind::fashion_mnist,
                           {{"fashion_mnist", DatasetKind::fashion_mnist},
                            {"mnist", DatasetKind::mnist},
                            {"cifar10", DatasetKind::cifar10},
                            {"cifar100", DatasetKind::cifar100},
                            {"image_folder", DatasetKind::image_folder},
                            {"text", DatasetKind::text},
                            {"chat", DatasetKind::chat}});
  if (s.dataset == DatasetKind::text || s.dataset == DatasetKind::chat) return read_text_data(r, s);
  const bool fashion = s.dataset == DatasetKind::fashion_mnist;
  s.root = r.get<std::string>("root", fashion ? "/usr/share/datasets/fashion-mnist" : "");
  if (s.root.empty())
    r.fail("root", fmt::format("expected the directory holding the {} files (only Fashion-MNIST has a packaged "
                               "default; see docs/data.md)",
                               dataset_name(s.dataset)));
  s.batch_size = r.get<int64_t>("batch_size", is_mnist(s.dataset) ? 64 : 128, Range::at_least(1));
  s.eval_batch_size = r.get<int64_t>("eval_batch_size", is_mnist(s.dataset) ? 1000 : 256, Range::at_least(1));
  s.num_workers = r.get("num_workers", is_mnist(s.dataset) ? 1 : 2, Range::closed(0, 64));
  s.pin_memory = r.get("pin_memory", true);
  s.train_limit = r.get<int64_t>("train_limit", 0, Range::non_negative());
  s.test_limit = r.get<int64_t>("test_limit", 0, Range::non_negative());
  // Keys that apply to some datasets only are rejected for the others, except at the value where they do nothing
  // (Note [A --set that switches a choice] in config_reader.h).
  if (s.dataset == DatasetKind::cifar100)
    s.label = r.get_choice("label", CifarLabelKind::fine, {{"fine", CifarLabelKind::fine}, {"coarse", CifarLabelKind::coarse}});
  else
    r.reject_unless("label", "fine", "coarse labels exist only for cifar100");
  const AugmentKind def_aug = is_cifar(s.dataset)                      ? AugmentKind::cifar
                              : s.dataset == DatasetKind::image_folder ? AugmentKind::imagenet
                                                                       : AugmentKind::none;
  s.augment = r.get_choice("augment", def_aug,
                           {{"none", AugmentKind::none}, {"cifar", AugmentKind::cifar}, {"imagenet", AugmentKind::imagenet}});
  if (s.dataset == DatasetKind::image_folder && s.augment == AugmentKind::none)
    r.fail("augment", "none cannot be used with image_folder: its images differ in size, and a batch needs them cropped "
                      "to one (use imagenet, the default)");
  s.image_size = r.get<int64_t>("image_size", 224, Range::at_least(8));
  s.eval_resize = r.get<int64_t>("eval_resize", 256, Range::at_least(8));
  if (s.eval_resize < s.image_size) r.fail("eval_resize", fmt::format("must be >= data.image_size ({})", s.image_size));
  s.repeated_augmentation = r.get<int64_t>("repeated_augmentation", 1, Range::at_least(1));
  std::vector<double> mean, std;
  switch (s.dataset) {
    case DatasetKind::fashion_mnist: mean = {0.28604}; std = {0.35302}; break;
    case DatasetKind::mnist: mean = {0.13066}; std = {0.30811}; break;
    case DatasetKind::cifar10: mean = {0.4914, 0.4822, 0.4465}; std = {0.2470, 0.2435, 0.2616}; break;
    case DatasetKind::cifar100: mean = {0.5071, 0.4865, 0.4409}; std = {0.2673, 0.2564, 0.2762}; break;
    case DatasetKind::image_folder: mean = {0.485, 0.456, 0.406}; std = {0.229, 0.224, 0.225}; break;
    case DatasetKind::text:
    case DatasetKind::chat: break;  // read by read_text_data
  }
  // The images' channels: MNIST-layout files hold grey images, CIFAR and decoded image files are RGB.
  const std::size_t channels = is_mnist(s.dataset) ? 1 : 3;
  ConfigReader norm = r.child("normalize");
  s.normalize_mean = norm.get_list<double>("mean", mean);
  if (s.normalize_mean.size() != 1 && s.normalize_mean.size() != channels)
    norm.fail("mean", fmt::format("expected one value, or one per channel of the {} images ({}), got {}",
                                  dataset_name(s.dataset), channels, s.normalize_mean.size()));
  s.normalize_std = norm.get_list<double>("std", std, Range::positive());
  if (s.normalize_mean.size() != s.normalize_std.size())
    norm.fail("std", fmt::format("has {} values but mean has {}", s.normalize_std.size(), s.normalize_mean.size()));
  if (s.dataset == DatasetKind::image_folder)
    r.reject_unless("resize", int64_t{0}, "image_folder images are already cropped to data.image_size; use that instead");
  else
    s.resize = r.get<int64_t>("resize", 0, Range::non_negative());
  ConfigReader mix = r.child("mix");
  s.mix.mixup_alpha = mix.get("mixup_alpha", 0.0, Range::non_negative());
  s.mix.cutmix_alpha = mix.get("cutmix_alpha", 0.0, Range::non_negative());
  s.mix.prob = mix.get("prob", 1.0, Range::closed(0.0, 1.0));
  s.mix.switch_prob = mix.get("switch_prob", 0.5, Range::closed(0.0, 1.0));
  s.mix.label_smoothing = mix.get("label_smoothing", 0.1, Range::half_open(0.0, 1.0));
  s.mix.mode = mix.get_enum("mode", "batch", {"batch", "elem"});
  s.mix.correct_lam = mix.get("correct_lam", true);
  s.rand_augment = read_rand_augment(r, channels);
  return s;
}

// model.name llama: the preset and model.llama.* (without init_from), activation checkpointing, LoRA.
void read_llama(ConfigReader& r, ModelSection& s) {
  if (s.init_from.empty()) {
    s.preset = r.get_enum("preset", "tiny", {"tiny", "sotu_small", "llama32_1b", "llama3_8b"});
    const models::LlamaConfig p = models::LlamaConfig::preset(s.preset);
    ConfigReader l = r.child("llama");
    models::LlamaConfig& c = s.llama;
    c = p;
    c.vocab_size = l.get<int64_t>("vocab_size", 0, Range::non_negative());
    c.hidden_size = l.get<int64_t>("hidden_size", p.hidden_size, Range::at_least(1));
    c.intermediate_size = l.get<int64_t>("intermediate_size", p.intermediate_size, Range::at_least(1));
    c.num_hidden_layers = l.get<int64_t>("num_hidden_layers", p.num_hidden_layers, Range::at_least(1));
    c.num_attention_heads = l.get<int64_t>("num_attention_heads", p.num_attention_heads, Range::at_least(1));
    c.num_key_value_heads = l.get<int64_t>("num_key_value_heads", p.num_key_value_heads, Range::at_least(1));
    c.head_dim = l.get<int64_t>("head_dim", p.head_dim, Range::non_negative());
    c.max_position_embeddings = l.get<int64_t>("max_position_embeddings", p.max_position_embeddings, Range::at_least(1));
    c.rms_norm_eps = l.get("rms_norm_eps", p.rms_norm_eps, Range::positive());
    c.rope_theta = l.get("rope_theta", p.rope_theta, Range::positive());
    c.tie_word_embeddings = l.get("tie_word_embeddings", p.tie_word_embeddings);
    c.initializer_range = l.get("initializer_range", p.initializer_range, Range::positive());
    // The shape rules of LlamaConfig::validate, which the model checks again once the tokenizer gives the vocabulary.
    // An error points at the first of the keys involved that the config gives (the preset gave the others).
    const auto given = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys)
        if (!l.location(k).empty()) return k;
      return *keys.begin();
    };
    if (c.num_attention_heads % c.num_key_value_heads != 0)
      l.fail(given({"num_key_value_heads", "num_attention_heads"}),
             fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}", c.num_attention_heads,
                         c.num_key_value_heads));
    if (c.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0)
      l.fail(given({"num_attention_heads", "hidden_size"}),
             fmt::format("hidden_size {} is not a multiple of num_attention_heads {} (with head_dim 0 the head dim is "
                         "hidden_size / num_attention_heads)", c.hidden_size, c.num_attention_heads));
    if (c.resolved_head_dim() % 2 != 0)
      l.fail(c.head_dim > 0 ? "head_dim" : given({"num_attention_heads", "hidden_size"}),
             fmt::format("the head dim {}{} must be even: rotary embeddings turn pairs of its values",
                         c.resolved_head_dim(), c.head_dim > 0 ? "" : " (hidden_size / num_attention_heads)"));
  } else {
    for (const char* key : {"preset", "llama"})
      r.reject(key, "the architecture comes from model.init_from; remove this key");
  }
  s.activation_checkpointing = r.get("activation_checkpointing", false);
  ConfigReader l = r.child("lora");
  const int64_t rank = l.get<int64_t>("rank", 0, Range::non_negative());
  nn::LoraConfig lora;
  lora.alpha = l.get("alpha", lora.alpha, Range::positive());
  lora.dropout = l.get("dropout", lora.dropout, Range::half_open(0.0, 1.0));
  lora.target_modules = l.get_list<std::string>("target_modules", lora.target_modules);
  if (lora.target_modules.empty()) l.fail("target_modules", "expected at least one module-name pattern (q_proj, ...)");
  if (rank > 0) {
    lora.rank = rank;
    s.lora = lora;
  }
}

ModelSection read_model(ConfigReader r) {
  ModelSection s;
  s.name = r.get_choice("name", ModelKind::mlp,
                        {{"mlp", ModelKind::mlp},
                         {"resnet18", ModelKind::resnet18},
                         {"resnet34", ModelKind::resnet34},
                         {"resnet50", ModelKind::resnet50},
                         {"vit", ModelKind::vit},
                         {"llama", ModelKind::llama}});
  // A llama has neither a class count nor weights to reset; the config.yaml of a llama run before these keys were
  // rejected records them at 0 and [] (Note [A --set that switches a choice] in config_reader.h).
  const bool llama = s.name == ModelKind::llama;
  if (llama)
    r.reject_unless("num_classes", int64_t{0}, "does not apply to llama: its outputs are the vocabulary "
                                               "(model.llama.vocab_size, or init_from's)");
  else
    s.num_classes = r.get<int64_t>("num_classes", 0, Range::non_negative());
  s.init_from = r.get<std::string>("init_from", "");
  if (llama)
    r.reject_unless("init_from_reset", std::vector<std::string>{},
                    "does not apply to llama: its init_from loads every weight of the checkpoint");
  else if (s.init_from.empty())
    r.reject_unless("init_from_reset", std::vector<std::string>{}, "needs model.init_from");
  else
    s.init_from_reset = r.get_list<std::string>("init_from_reset", {});
  if (s.name == ModelKind::mlp) {
    s.hidden = r.get_list<int64_t>("hidden", {256, 128}, Range::at_least(1));
    s.activation = r.get_enum("activation", "relu", {"relu", "gelu"});
  } else if (s.name == ModelKind::llama) {
    read_llama(r, s);
  } else if (s.name == ModelKind::vit) {
    s.patch_size = r.get<int64_t>("patch_size", 4, Range::at_least(1));
    s.dim = r.get<int64_t>("dim", 384, Range::at_least(1));
    s.depth = r.get<int64_t>("depth", 12, Range::at_least(1));
    s.heads = r.get<int64_t>("heads", 6, Range::at_least(1));
    if (s.dim % s.heads != 0) r.fail("heads", fmt::format("model.dim {} must be divisible by heads {}", s.dim, s.heads));
    s.mlp_ratio = r.get("mlp_ratio", 4.0, Range::positive());
    s.pool = r.get_enum("pool", "token", {"token", "mean"});
    s.dropout = r.get("dropout", 0.0, Range::half_open(0.0, 1.0));
    s.drop_path = r.get("drop_path", 0.0, Range::half_open(0.0, 1.0));
  } else {
    s.stem = r.get_enum("stem", "auto", {"auto", "cifar", "imagenet"});
    s.zero_init_residual = r.get("zero_init_residual", false);
    s.channels_last = r.get_enum("channels_last", "auto", {"auto", "true", "false"});
    s.fusion = r.get_enum("fusion", "bn_add_relu", {"none", "bn_relu", "bn_add_relu"});
  }
  return s;
}

OptimSection read_optim(ConfigReader r, ModelKind model) {
  OptimSection s;
  s.name = r.get_choice("name", OptimKind::sgd, {{"sgd", OptimKind::sgd}, {"adamw", OptimKind::adamw}});
  s.lr = r.get("lr", s.name == OptimKind::sgd ? 0.05 : 1e-3, Range::positive());
  if (s.name == OptimKind::sgd) {
    s.momentum = r.get("momentum", 0.9, Range::half_open(0.0, 1.0));
    s.nesterov = r.get("nesterov", false);
    if (s.nesterov && s.momentum == 0.0) r.fail("nesterov", "nesterov momentum needs optim.momentum > 0");
    s.weight_decay = r.get("weight_decay", 0.0, Range::non_negative());
  } else {
    s.beta1 = r.get("beta1", 0.9, Range::half_open(0.0, 1.0));
    s.beta2 = r.get("beta2", 0.999, Range::half_open(0.0, 1.0));
    s.eps = r.get("eps", 1e-8, Range::positive());
    s.weight_decay = r.get("weight_decay", 0.05, Range::non_negative());
  }
  s.decay_norm_and_bias = r.get("decay_norm_and_bias", false);
  s.clip_grad_norm = r.get("clip_grad_norm", 0.0, Range::non_negative());
  ConfigReader mult = r.child("lr_multipliers");
  for (const std::string& pattern : mult.keys())
    s.lr_multipliers.emplace_back(pattern, mult.get<double>(pattern, 1.0, Range::non_negative()));
  if (model == ModelKind::vit)
    s.layer_decay = r.get("layer_decay", 1.0, Range::open_closed(0.0, 1.0));
  else
    r.reject_unless("layer_decay", 1.0,
                    fmt::format("layer-wise decay is defined for model.name vit (its blocks), not {}", model_name(model)),
                    "model.name");
  return s;
}

ScheduleSection read_schedule(ConfigReader r) {
  ScheduleSection s;
  s.name = r.get_choice("name", ScheduleName::constant,
                        {{"constant", ScheduleName::constant},
                         {"step", ScheduleName::step},
                         {"multistep", ScheduleName::multistep},
                         {"cosine", ScheduleName::cosine},
                         {"cosine_restarts", ScheduleName::cosine_restarts}});
  s.warmup_epochs = r.get("warmup_epochs", 0.0, Range::non_negative());
  s.warmup_steps = r.get<int64_t>("warmup_steps", 0, Range::non_negative());
  if (s.warmup_steps > 0 && s.warmup_epochs > 0)
    r.fail("warmup_steps", fmt::format("give warmup_steps or warmup_epochs, not both: schedule.warmup_epochs ({}) is {} "
                                       "as well; remove one of them or set it to 0",
                                       r.location("warmup_epochs"), s.warmup_epochs));
  s.warmup_start_factor = r.get("warmup_start_factor", 0.0, Range::closed(0.0, 1.0));
  if (s.name == ScheduleName::multistep) s.milestones = r.get_list<double>("milestones", {}, Range::positive());
  if (s.name == ScheduleName::step) s.step_epochs = r.get("step_epochs", 30.0, Range::positive());
  if (s.name == ScheduleName::step || s.name == ScheduleName::multistep) s.gamma = r.get("gamma", 0.1, Range::positive());
  if (s.name == ScheduleName::cosine || s.name == ScheduleName::cosine_restarts)
    s.min_lr = r.get("min_lr", 0.0, Range::non_negative());
  if (s.name == ScheduleName::cosine_restarts) {
    s.restart_epochs = r.get("restart_epochs", s.restart_epochs, Range::positive());
    s.restart_mult = r.get<int64_t>("restart_mult", s.restart_mult, Range::at_least(1));
  }
  return s;
}

TrainSection read_train(ConfigReader r, const DataSection& data) {
  TrainSection s;
  s.epochs = r.get<int64_t>("epochs", 3, Range::at_least(1));
  s.log_every = r.get<int64_t>("log_every", 100, Range::at_least(1));
  s.max_steps = r.get<int64_t>("max_steps", 0, Range::non_negative());
  const std::string device = r.get<std::string>("device", "cpu");
  try {
    s.device = parse_device(device);
  } catch (const Error&) {
    r.fail("device", fmt::format("expected cpu, cuda or cuda:N, got {}", device));
  }
  // fp32 or f32, fp64 or f64 (Note [Float spellings] in core/spellings.h).
  s.dtype = r.get_choice("dtype", DType::f32, {{"fp32", DType::f32}, {"fp64", DType::f64}}, float_spellings());
  s.precision = r.get_choice("precision", Precision::fp32, {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}},
                             float_spellings());
  // With data.mix every training batch carries soft targets, smoothed by mix.label_smoothing (timm's
  // SoftTargetCrossEntropy after Mixup): train.label_smoothing would be ignored, so it is refused.
  if (data.mix.enabled())
    r.reject_unless("label_smoothing", 0.0, "data.mix is on, and its soft targets are smoothed by "
                                            "data.mix.label_smoothing instead; remove train.label_smoothing",
                    "data.mix");
  else
    s.label_smoothing = r.get("label_smoothing", 0.0, Range::half_open(0.0, 1.0));
  s.eval_every = r.get<int64_t>("eval_every", 1, Range::at_least(1));
  s.eval_every_steps = r.get<int64_t>("eval_every_steps", 0, Range::non_negative());
  s.tf32 = r.get("tf32", false);
  s.cuda_graph = r.get_enum("cuda_graph", "auto", {"auto", "true", "false"});
  s.grad_accum_steps = r.get<int64_t>("grad_accum_steps", 1, Range::at_least(1));
  s.peak_tflops = r.get("peak_tflops", 989.0, Range::positive());
  s.freeze = r.get_list<std::string>("freeze", {});
  for (const std::string& p : s.freeze)
    if (p.empty() || p == "!") r.fail("freeze", "expected name patterns such as \"*\" or \"!fc.*\", got an empty one");
  return s;
}

CheckpointSection read_checkpoint(ConfigReader r, const std::string& out_dir) {
  CheckpointSection s;
  s.every_epochs = r.get<int64_t>("every_epochs", 0, Range::non_negative());
  s.every_steps = r.get<int64_t>("every_steps", 0, Range::non_negative());
  s.keep_last = r.get("keep_last", 2, Range::non_negative());
  s.keep_best = r.get("keep_best", true);
  // Unset (recorded as "" in the saved config.yaml) means <run.out_dir>/checkpoints, derived from the out_dir
  // of the run that reads the config: a saved config re-run with another run.out_dir writes only there.
  const std::string dir = r.get<std::string>("dir", "");
  s.dir = dir.empty() ? (std::filesystem::path(out_dir) / "checkpoints").string() : dir;
  s.continue_on_save_failure = r.get_enum("on_save_failure", "stop", {"stop", "continue"}) == "continue";
  return s;  // sharded: read_sharded, once dist.mode is known
}

// checkpoint.sharded, read after the dist section: only fsdp has shards to write, so under another mode the key is
// rejected, except at true, which a config.yaml saved by a run records (Note [A --set that switches a choice] in
// config_reader.h). It is the checkpoint section's last key, so the resolved config keeps the order it has when the
// sections are read one after the other.
bool read_sharded(ConfigReader r, dist::DistMode mode) {
  if (mode == dist::DistMode::fsdp) return r.get("sharded", true);
  r.reject_unless("sharded", true,
                  fmt::format("applies to dist.mode fsdp only (no other mode writes shards), got mode {}",
                              dist::dist_mode_name(mode)),
                  "dist.mode");
  return true;
}

EmaSection read_ema(ConfigReader r) {
  EmaSection s;
  s.decay = r.get("decay", s.decay, Range::open(0.0, 1.0));
  s.every_steps = r.get<int64_t>("every_steps", s.every_steps, Range::at_least(1));
  s.restart_during_warmup = r.get("restart_during_warmup", s.restart_during_warmup);
  s.evaluate = r.get("evaluate", s.evaluate);
  return s;
}

}  // namespace

std::string dataset_name(DatasetKind d) {
  switch (d) {
    case DatasetKind::fashion_mnist: return "fashion_mnist";
    case DatasetKind::mnist: return "mnist";
    case DatasetKind::cifar10: return "cifar10";
    case DatasetKind::cifar100: return "cifar100";
    case DatasetKind::image_folder: return "image_folder";
    case DatasetKind::text: return "text";
    case DatasetKind::chat: return "chat";
  }
  return "?";
}

std::string model_name(ModelKind m) {
  switch (m) {
    case ModelKind::mlp: return "mlp";
    case ModelKind::resnet18: return "resnet18";
    case ModelKind::resnet34: return "resnet34";
    case ModelKind::resnet50: return "resnet50";
    case ModelKind::vit: return "vit";
    case ModelKind::llama: return "llama";
  }
  return "?";
}

// Note [data.seq_len's default]
// A config without data.seq_len takes the model's context: its max_position_embeddings, at most 512 (the rows of the
// recipes; a large context such as Llama-3.2's 131072 positions would make rows no test-size run affords). A
// preset's positions (with the model.llama overrides) are known when the config is read, and read_sections records
// the value then. model.init_from's are in the source's files, read when the run starts: seq_len stays 0 in the
// config until with_source_seq_len (causal_lm_setup.h) sets it and records it in resolved_yaml. Either way the run's
// config.yaml holds the value used, so the saved config runs again the same. A seq_len the config gives that is
// longer than the model's positions is an error: check_data_fits_model for a preset, make_llama for init_from.
int64_t default_seq_len(int64_t max_position_embeddings) { return std::min<int64_t>(512, max_position_embeddings); }

void set_default_seq_len(TrainerConfig& c, int64_t max_position_embeddings) {
  HT_ASSERT(c.data.text.seq_len == 0, "data.seq_len is already {}", c.data.text.seq_len);
  c.data.text.seq_len = default_seq_len(max_position_embeddings);
  YAML::Node resolved = YAML::Load(c.resolved_yaml);
  resolved["data"]["seq_len"] = c.data.text.seq_len;
  YAML::Emitter out;
  out << resolved;
  c.resolved_yaml = std::string(out.c_str()) + "\n";
}

namespace {

// How read_sections treats an error in a section: `stop` throws it; `go_on` (the config as the file alone gives it,
// Note [A --set that switches a choice] in config_reader.h) goes on with the section's defaults, since the file may
// hold a mistake that a --set corrects: the keys read up to the error still count.
enum class OnError { stop, go_on };

// `key` of `section` and its `value`, for a message about another key: "data.dataset mnist (x.yaml:2:12)",
// "data.dataset fashion_mnist (the default)".
std::string named(ConfigReader section, const std::string& key, const std::string& value) {
  const std::string at = section.location(key);
  return fmt::format("{} {} ({})", section.key_path(key), value, at.empty() ? "the default" : at);
}

// The checks between data and model: a language model (llama) trains on text or chat data, the others on images; a
// llama made from a preset (no init_from) fits data.seq_len in its positions (init_from's are checked at setup).
void check_data_fits_model(ConfigReader root, const TrainerConfig& c) {
  ConfigReader data = root.child("data"), model = root.child("model");
  const bool text = c.data.dataset == DatasetKind::text || c.data.dataset == DatasetKind::chat;
  if (text != (c.model.name == ModelKind::llama))
    model.fail("name", fmt::format("{} and model.name {} do not go together: a language model (llama) trains on "
                                   "text or chat data, the other models on images",
                                   named(data, "dataset", dataset_name(c.data.dataset)), model_name(c.model.name)));
  if (text && c.model.init_from.empty() && c.data.text.seq_len > c.model.llama.max_position_embeddings) {
    const std::string positions = model.child("llama").location("max_position_embeddings");
    data.fail("seq_len", fmt::format("{} is longer than the model's max_position_embeddings {} ({})",
                                     c.data.text.seq_len, c.model.llama.max_position_embeddings,
                                     positions.empty() ? "model.preset " + c.model.preset + "'s"
                                                       : "model.llama.max_position_embeddings, " + positions));
  }
}

// Every section of `root`, in an order where a section's defaults and checks see the sections they depend on.
TrainerConfig read_sections(ConfigReader root, OnError on_error) {
  TrainerConfig c;
  c.source = root.source();
  const auto section = [&](const std::string& key, auto read) {
    if (on_error == OnError::stop) return read(root.child(key));
    try {
      return read(root.child(key));
    } catch (const Error&) {
      return decltype(read(root.child(key))){};
    }
  };
  const std::string default_name = std::filesystem::path(root.source()).stem().string();
  c.run = section("run", [&](ConfigReader r) { return read_run(r, default_name); });
  c.data = section("data", read_data);
  c.model = section("model", read_model);
  // Note [data.seq_len's default]: a preset's positions are known now.
  const bool text = c.data.dataset == DatasetKind::text || c.data.dataset == DatasetKind::chat;
  if (text && c.data.text.seq_len == 0 && c.model.name == ModelKind::llama && c.model.init_from.empty())
    c.data.text.seq_len =
        root.child("data").get<int64_t>("seq_len", default_seq_len(c.model.llama.max_position_embeddings));
  c.optim = section("optim", [&](ConfigReader r) { return read_optim(r, c.model.name); });
  c.schedule = section("schedule", read_schedule);
  c.train = section("train", [&](ConfigReader r) { return read_train(r, c.data); });
  c.checkpoint = section("checkpoint", [&](ConfigReader r) { return read_checkpoint(r, c.run.out_dir); });
  c.grad_pipeline = section("grad_pipeline", [&](ConfigReader r) { return read_grad_pipeline(r, c.run.seed); });
  c.dist = section("dist", dist::read_dist_options);
  c.checkpoint.sharded = section("checkpoint", [&](ConfigReader r) { return read_sharded(r, c.dist.mode); });
  if (root.has("ema")) {
    c.ema = section("ema", read_ema);
    // fsdp shards the weights over the ranks (each holds a slice of every tensor): no rank has the whole
    // weights to average, and no other mode needs more than this process's copy.
    if (c.dist.mode == dist::DistMode::fsdp && on_error == OnError::stop)
      root.fail("ema", "a weight average is not kept under dist.mode fsdp (each rank holds only shards of the "
                       "weights); use dist.mode ddp or none, or remove the ema section");
  }
  return c;
}

}  // namespace

TrainerConfig read_trainer_config(ConfigReader root) {
  TrainerConfig c = read_sections(root, OnError::stop);
  if (root.overridden()) {  // Note [A --set that switches a choice] in config_reader.h
    ConfigReader file = root.as_in_file();
    read_sections(file, OnError::go_on);
    root.drop_keys_only_read_by(file);
  }
  root.finish();
  // After finish(): a key that is misspelt or does not apply is named before what the values mean together.
  check_data_fits_model(root, c);
  for (const std::string& note : root.notes()) logging::warn_once_per_job("{}", note);
  c.resolved_yaml = root.resolved_yaml();
  return c;
}

TrainerConfig load_trainer_config(const std::string& path, const std::vector<std::string>& overrides) {
  return read_trainer_config(ConfigReader::load_file(path, overrides));
}

}  // namespace ht::train
