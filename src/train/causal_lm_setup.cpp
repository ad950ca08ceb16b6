// The language-model parts of the trainer's setup (causal_lm_setup.h).
#include "causal_lm_setup.h"

#include <charconv>
#include <cstdlib>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "hadatrain/autograd/checkpoint.h"
#include "hadatrain/core/error.h"
#include "hadatrain/data/chat_template.h"
#include "hadatrain/data/text_data.h"
#include "hadatrain/data/text_loader.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/io/json_metadata.h"
#include "hadatrain/nn/lora.h"
#include "hadatrain/train/causal_lm.h"
#include "hadatrain/train/peft_adapter.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;

// "~/x" as $HOME/x, as a shell would (configs name the fetch cache that way); other paths unchanged.
std::string expand_home(const std::string& p) {
  if (p.size() < 2 || p[0] != '~' || p[1] != '/') return p;
  const char* home = std::getenv("HOME");
  return home && *home ? std::string(home) + p.substr(1) : p;
}

nlohmann::json lora_to_json(const nn::LoraConfig& c) {
  return {{"rank", c.rank}, {"alpha", c.alpha}, {"dropout", c.dropout}, {"target_modules", c.target_modules}};
}

nn::LoraConfig lora_from_json(const nlohmann::json& j) {
  nn::LoraConfig c;
  c.rank = j.at("rank").get<int64_t>();
  c.alpha = j.at("alpha").get<double>();
  c.dropout = j.at("dropout").get<double>();
  c.target_modules = j.at("target_modules").get<std::vector<std::string>>();
  return c;
}

// Runs each block through autograd/checkpoint.h (model.activation_checkpointing): a block keeps only its
// input for backward. Generation (a KV cache) runs without gradients and needs no recompute.
models::LlamaBlockRunner checkpointed_blocks(Generator* dropout_gen) {
  return [dropout_gen](models::LlamaBlock& block, const Tensor& x, const models::LlamaBlockContext& ctx) {
    if (ctx.cache != nullptr) return block.forward(x, ctx);
    CheckpointOptions o;
    o.generators = {dropout_gen};
    return checkpoint([&block, ctx](const std::vector<Tensor>& in) { return std::vector<Tensor>{block.forward(in[0], ctx)}; },
                      {x}, o)[0];
  };
}

// A Llama of config `c` (weights left for the caller to load when `load` is set), with LoRA layers when `lora`.
std::shared_ptr<models::Llama> build_llama(const models::LlamaConfig& c, const std::optional<nn::LoraConfig>& lora,
                                           bool load, Generator& init_gen, std::shared_ptr<Generator> dropout_gen) {
  models::LlamaBuild b;
  b.init = load ? models::LlamaInit::none : models::LlamaInit::normal;
  b.gen = &init_gen;
  std::optional<nn::LoraFactory> lf;
  if (lora) {
    lora->validate();
    // The adapters draw from a generator of their own, so adding LoRA does not change the base weights' draws.
    lf.emplace(*lora, std::make_shared<Generator>(init_gen.seed() ^ 0x10FA'0000'0000'0000ull), dropout_gen);
    b.make_linear = lf->factory();
  }
  auto model = std::make_shared<models::Llama>(c, b);
  if (lf) {
    lf->check_targets();
    spdlog::info("model.lora: rank {} alpha {:g} on {} layer(s); the base weights are frozen", lora->rank,
                 lora->alpha, lf->wrapped().size());
  }
  return model;
}

// The weights of `src` under HF names (a LoRA checkpoint also holds its adapters).
std::map<std::string, Tensor> source_tensors(const LlamaSource& src) {
  if (src.kind == LlamaSource::Kind::hf) return models::read_hf_weights(src.dir).tensors;
  io::Checkpoint ck;  // a sharded checkpoint's shards joined to what model.safetensors holds
  ck.dir = src.dir;
  ck.model = io::load_safetensors(src.dir / "model.safetensors");
  dist::consolidate_checkpoint(ck);
  return std::move(ck.model.tensors);
}

// data.train_limit / test_limit: the first `limit` rows of `d` in its order (0, or a limit at or above its size: all).
// `key` names the limit in the log line that says how many rows it keeps.
std::shared_ptr<const data::TextDataset> first_rows(std::shared_ptr<const data::TextDataset> d, int64_t limit,
                                                    const char* key) {
  if (limit <= 0 || limit >= d->size()) return d;
  spdlog::info("{} {}: the first {} of the split's {} rows", key, limit, limit, d->size());
  std::vector<int64_t> rows(static_cast<std::size_t>(limit));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  return std::make_shared<const data::TextSubset>(std::move(d), std::move(rows));
}

}  // namespace

void make_text_datasets(const TrainerConfig& cfg, Datasets& ds) {
  HT_ASSERT(cfg.data.text.seq_len > 0, "data.seq_len is not decided yet: the config goes through with_source_seq_len "
                                       "before its data is made");
  data::TextDataOptions o = cfg.data.text;
  for (auto& p : o.paths) p = expand_home(p);
  for (auto& p : o.val_paths) p = expand_home(p);
  if (!o.cache_dir.empty()) o.cache_dir = expand_home(o.cache_dir);
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(o.tokenizer);
  data::TextDatasets t = data::make_text_datasets(o, *tok, cfg.run.seed);
  HT_CHECK(t.val != nullptr, "data.val_fraction is 0 and data.val_paths is empty: a language-model run needs "
                             "validation text (set one of them)");
  ds.text_train = first_rows(t.train, cfg.data.train_limit, "data.train_limit");
  ds.text_test = first_rows(t.val, cfg.data.test_limit, "data.test_limit");
  ds.vocab_size = tok->vocab_size();
  ds.tokenizer_fingerprint = tok->fingerprint();
  if (const auto b = tok->bos_id()) ds.bos_id = *b;
  if (const auto e = tok->eos_id()) ds.eos_ids.push_back(*e);
  // Chat data ends each assistant turn with the template's end-of-turn token (Llama-3's <|eot_id|>): a model
  // trained on it stops there, as Llama-3-Instruct's config.json lists it among its eos ids.
  if (cfg.data.dataset == DatasetKind::chat)
    ds.chat_format = o.chat_format.empty() ? data::chat_format_name(data::default_chat_format(*tok)) : o.chat_format;
  if (cfg.data.dataset == DatasetKind::chat)
    if (const auto eot = tok->token_to_id("<|eot_id|>"); eot && (ds.eos_ids.empty() || ds.eos_ids.front() != *eot))
      ds.eos_ids.push_back(*eot);
}

// Note [init_from's tokenizer]
// The rows of a model's embedding (and of an untied LM head) stand for the ids of the tokenizer it was trained with,
// so model.init_from compares data.tokenizer with that one: the fingerprint and size a checkpoint records, the file
// a checkpoint records without them, or the tokenizer in an HF folder. The same fingerprint: the same tokenizer.
// Another number of ids is an error: the ids would index rows trained for other tokens. (A tokenizer extended with
// tokens of its own is refused too: sizes and fingerprints cannot tell it from another tokenizer.) The same number
// with another fingerprint is a warning naming both: the same vocabulary in other files (a copy beside another
// tokenizer_config.json) is fine, another vocabulary of the same size is a mistake, and the files alone do not say
// which. A source whose tokenizer is unknown (an HF folder without one, a checkpoint whose recorded file is gone and
// that records no fingerprint) gets a warning that data.tokenizer could not be checked.
namespace {
void check_source_tokenizer(const LlamaSource& src, const std::string& data_tokenizer, const Datasets& ds) {
  const std::string source = src.dir.string();
  std::string path = src.tokenizer.string(), fingerprint = src.tokenizer_fingerprint;
  int64_t vocab = src.tokenizer_vocab_size;
  if (fingerprint.empty() || vocab == 0) {
    std::string why;
    std::error_code ec;
    if (path.empty())
      why = "its model.safetensors records no tokenizer";
    else if (!fs::exists(path, ec))
      why = fmt::format("it records the tokenizer {}, which does not exist", path);
    else if (src.kind == LlamaSource::Kind::hf && !fs::exists(src.dir / "tokenizer.json", ec) &&
             !fs::exists(src.dir / "tokenizer.model", ec))
      why = "the folder holds no tokenizer (tokenizer.json or tokenizer.model)";
    if (why.empty()) {
      try {
        const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(path);
        fingerprint = tok->fingerprint();
        vocab = tok->vocab_size();
      } catch (const Error& e) {
        why = fmt::format("its tokenizer {} cannot be read: {}", path, e.what());
      }
    }
    if (!why.empty()) {
      spdlog::warn("model.init_from {}: {}, so data.tokenizer {} ({} ids) cannot be checked against the tokenizer the "
                   "model was trained with; make sure it is that one (the embedding rows stand for its ids)",
                   source, why, data_tokenizer, ds.vocab_size);
      return;
    }
  }
  if (fingerprint == ds.tokenizer_fingerprint) return;
  const std::string theirs = fmt::format("the tokenizer {} ({} ids, fingerprint {})", path, vocab, fingerprint);
  const std::string ours = fmt::format("data.tokenizer {} ({} ids, fingerprint {})", data_tokenizer, ds.vocab_size,
                                       ds.tokenizer_fingerprint);
  HT_CHECK(vocab == ds.vocab_size, "model.init_from {}: the model was trained with {}, but {} has another number of "
           "ids: its ids would index embedding rows trained for other tokens. Set data.tokenizer to {}",
           source, theirs, ours, path);
  spdlog::warn("model.init_from {}: the model was trained with {}; {} has as many ids but other files. If its ids "
               "are not the same tokens, the embedding rows mean other tokens: set data.tokenizer to {} unless it "
               "holds the same vocabulary", source, theirs, ours, path);
}
}  // namespace

TrainerConfig with_source_seq_len(TrainerConfig cfg, const InitFromSource* init_from) {
  const bool text = cfg.data.dataset == DatasetKind::text || cfg.data.dataset == DatasetKind::chat;
  if (!text || cfg.data.text.seq_len != 0 || cfg.model.init_from.empty()) return cfg;
  const int64_t positions = init_from != nullptr && init_from->llama
                                ? init_from->llama->config.max_position_embeddings
                                : find_llama_source(cfg.model.init_from).config.max_position_embeddings;
  set_default_seq_len(cfg, positions);
  spdlog::info("data.seq_len {}: model.init_from {}'s max_position_embeddings {}, at most 512 (data.seq_len not given)",
               cfg.data.text.seq_len, cfg.model.init_from, positions);
  return cfg;
}

// Note [LM model sources]
// model.init_from names where the weights come from: an HF folder (config.json + safetensors) or one of our
// LM checkpoints (a step_<N> folder, or a checkpoint root whose `latest` is used), whose model.safetensors
// records the model's config.json (kLlamaConfigKey). Either way the architecture is the source's, and
// model.preset / model.llama.* are not read. Without init_from the model is model.preset with the
// model.llama.* keys applied, vocab_size 0 meaning the tokenizer's, initialised as HF initialises a Llama.
// model.lora wraps the target layers either way; the adapters start fresh (B = 0: the model computes what
// the source did). A resumed run reads the source's architecture only: its checkpoint holds every weight (the
// frozen base included), so reading the source's weights too would only cost time (16 GB for an 8B base).
std::shared_ptr<nn::Module> make_llama(const TrainerConfig& cfg, const Datasets& ds, Generator& init_gen,
                                       std::shared_ptr<Generator> dropout_gen, const ModelStart& start) {
  const ModelSection& m = cfg.model;
  std::optional<LlamaSource> src;
  models::LlamaConfig c = m.llama;
  if (!m.init_from.empty()) {
    HT_ASSERT(start.init_from != nullptr && start.init_from->llama.has_value(),
              "make_llama: model.init_from {} is not resolved", m.init_from);
    src = *start.init_from->llama;  // Note [model.init_from resolved once] in trainer_setup.cpp
    if (src->peft.empty()) {
      HT_CHECK(!src->lora, "model.init_from: {} is a checkpoint of a LoRA run; convert it to an HF folder first "
                           "(hadatrain convert merges the adapters) and start from that",
               src->dir.string());
    } else {
      // A PEFT adapter folder: its adapters continue as the run's, so model.lora must build them as they are.
      const PeftFolder f = read_peft_folder(src->peft);
      HT_CHECK(m.lora.has_value(), "model.init_from: {} is a PEFT LoRA adapter (r {}, lora_alpha {:g}, target_modules "
               "{}), but the config has no model.lora; set model.lora to those values to train its adapters on, or start "
               "from its base {}", src->peft.string(), f.lora.rank, f.lora.alpha,
               nlohmann::json(f.lora.target_modules).dump(), src->dir.string());
      check_peft_lora(*m.lora, f, "model.init_from " + src->peft.string());
    }
    c = src->config;
  } else {
    if (c.vocab_size == 0) c.vocab_size = ds.vocab_size;
    // A model made here speaks its tokenizer: the preset's ids (1 and 2, Llama-2's) are other tokens in another
    // vocabulary (Llama-3's '"' and '#'), where generation would stop.
    if (ds.bos_id) c.bos_token_id = *ds.bos_id;
    if (!ds.eos_ids.empty()) c.eos_token_ids = ds.eos_ids;
  }
  c.validate(m.init_from.empty() ? "model.llama" : m.init_from);
  if (src && !ds.tokenizer_fingerprint.empty()) check_source_tokenizer(*src, cfg.data.text.tokenizer, ds);
  if (ds.text_train) {
    ds.text_train->check_vocab(c.vocab_size, "the model's vocab_size");
    HT_CHECK(cfg.data.text.seq_len <= c.max_position_embeddings,
             "data.seq_len {} is longer than the model's max_position_embeddings {}", cfg.data.text.seq_len,
             c.max_position_embeddings);
  }
  auto model = build_llama(c, m.lora, src.has_value(), init_gen, dropout_gen);
  if (src && start.weights == InitWeights::read) {
    models::load_hf_tensors(*model, source_tensors(*src), src->dir.string());
    spdlog::info("model.init_from: weights of {}", src->dir.string());
    if (!src->peft.empty()) {
      const int64_t layers = load_peft_tensors(*model, read_peft_folder(src->peft));
      spdlog::info("model.init_from: the adapters of {} ({} LoRA layer(s)) on that base", src->peft.string(), layers);
    }
  } else if (src) {
    spdlog::info("model.init_from: the architecture of {} (the weights come from the checkpoint resumed or evaluated)",
                 src->dir.string());
  }
  if (cfg.train.precision == Precision::bf16) model->compute_dtype = DType::bf16;
  if (m.activation_checkpointing) model->block_runner = checkpointed_blocks(dropout_gen.get());
  return model;
}

void store_frozen_in_compute_dtype(const TrainerConfig& cfg, nn::Module& model) {
  if (cfg.train.precision != Precision::bf16 || dynamic_cast<const models::Llama*>(&model) == nullptr) return;
  const optim::FreezeRules rules = freeze_rules(cfg);
  for (auto& [name, t] : model.named_parameters()) t->set_requires_grad(!rules.frozen(name));  // apply_param_rules'
  const nn::FrozenStore f = nn::store_frozen_in(model, DType::bf16);
  if (f.params > 0)
    spdlog::info("train.precision bf16: {} frozen matri{} held in bf16 ({:.1f} MB instead of {:.1f} MB as f32)",
                 f.params, f.params == 1 ? "x" : "ces", static_cast<double>(f.bytes_after) / 1e6,
                 static_cast<double>(f.bytes_before) / 1e6);
}

std::unique_ptr<Task> make_causal_lm_task(const TrainerConfig& cfg, nn::Module& model) {
  CausalLmOptions o;
  o.labels = LmLabels::next_token;  // make_text_loader's layout
  if (const auto* llama = dynamic_cast<const models::Llama*>(&model)) {
    const models::LlamaConfig& c = llama->config;
    // The input embedding is a lookup, not a product; tied, the same table is the LM head's product.
    const int64_t lookup = c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size;
    o.flops_per_token = transformer_flops_per_token({.matmul_params = c.num_parameters() - lookup,
                                                     .layers = c.num_hidden_layers,
                                                     .attention_dim = c.num_attention_heads * c.resolved_head_dim(),
                                                     .seq_len = cfg.data.text.seq_len});
  }
  return std::make_unique<CausalLm>(o);
}

std::unique_ptr<BatchSource> make_text_loader(const TrainerConfig& cfg, const Datasets& ds, Split split,
                                              int64_t min_last_batch) {
  data::TextLoaderOptions o;
  o.batch_size = split == Split::train ? cfg.data.batch_size : cfg.data.eval_batch_size;
  o.labels = data::LabelLayout::next_token;
  o.seed = cfg.run.seed;
  o.shuffle = split == Split::train ? data::Shuffle::on : data::Shuffle::off;
  o.drop_last = data::DropLast::no;
  o.min_last_batch = min_last_batch;
  o.pin_memory = cfg.data.pin_memory && cfg.train.device.is_cuda();
  if (o.pin_memory) o.pin_device = cfg.train.device;
  return std::make_unique<LoaderSource<data::TextLoader>>(split == Split::train ? ds.text_train : ds.text_test, o);
}

io::Metadata lm_checkpoint_metadata(const TrainerConfig& cfg, const Datasets& ds, nn::Module& model) {
  io::Metadata md;
  const auto* llama = dynamic_cast<const models::Llama*>(&model);
  if (llama == nullptr) return md;
  md[kLlamaConfigKey] = llama->config.to_json().dump();
  if (!cfg.data.text.tokenizer.empty()) {
    record_tokenizer(md, expand_home(cfg.data.text.tokenizer), ds.tokenizer_fingerprint, ds.vocab_size);
  }
  if (cfg.model.lora) md[kLoraKey] = lora_to_json(*cfg.model.lora).dump();
  if (!ds.chat_format.empty()) md[kChatFormatKey] = ds.chat_format;
  return md;
}

void record_tokenizer(io::Metadata& md, const fs::path& path, const std::string& fingerprint, int64_t vocab_size) {
  md[kTokenizerKey] = fs::absolute(path).string();
  md[kTokenizerFingerprintKey] = fingerprint;
  md[kTokenizerVocabSizeKey] = std::to_string(vocab_size);
}

namespace {

// A PEFT adapter folder on its base model: base_model_name_or_path resolved as a path (relative to the working
// directory, as peft resolves a local one). A hub id is not fetched.
LlamaSource find_peft_source(const fs::path& path) {
  const PeftFolder f = read_peft_folder(path);
  const std::string file = (path / kPeftConfigFile).string();
  const std::string& base = f.base_model_name_or_path;
  HT_CHECK(!base.empty(), "{} is a PEFT LoRA adapter whose base model is not named: base_model_name_or_path is null in "
           "{}. Set it to the HF folder (or hadatrain checkpoint) whose weights the adapters were trained on",
           path.string(), file);
  std::error_code ec;
  HT_CHECK(fs::is_directory(expand_home(base), ec),
           "{} is a PEFT LoRA adapter on the base model '{}' (base_model_name_or_path in {}), which is not a local "
           "folder; hadatrain does not download from the hub: download it and set base_model_name_or_path to its "
           "folder (or to a hadatrain checkpoint of the same weights)",
           path.string(), base, file);
  HT_CHECK(!is_peft_folder(expand_home(base)), "{}: base_model_name_or_path {} is itself a PEFT adapter folder; name "
           "the base model's HF folder or checkpoint", file, base);
  LlamaSource src = find_llama_source(expand_home(base));
  HT_CHECK(!src.lora, "{}: base_model_name_or_path {} is a checkpoint of a LoRA run; a PEFT adapter's base is a model "
           "without adapters (convert the checkpoint to an HF folder, which merges them, and name that)", file, base);
  src.lora = f.lora;
  src.peft = path;
  return src;
}

}  // namespace

LlamaSource find_llama_source(const fs::path& path) {
  std::error_code ec;
  HT_CHECK(fs::is_directory(path, ec), "{} is not a directory (expected an HF model folder with config.json, or a "
                                       "checkpoint folder of a language-model run)",
           path.string());
  LlamaSource src;
  if (is_peft_folder(path)) return find_peft_source(path);
  if (fs::exists(path / "config.json", ec)) {
    src.kind = LlamaSource::Kind::hf;
    src.dir = path;
    src.config = models::read_hf_config(path);
    src.tokenizer = path;
    return src;
  }
  fs::path dir = path;
  if (!fs::exists(dir / "model.safetensors", ec)) {
    const std::optional<int64_t> latest = io::latest_checkpoint_step(path);
    HT_CHECK(latest.has_value(), "{} holds neither config.json (an HF model folder), model.safetensors (a checkpoint) "
                                 "nor step_<N> checkpoints",
             path.string());
    dir = io::checkpoint_dir(path, *latest);
  }
  const io::Metadata md = io::read_safetensors_header(dir / "model.safetensors").metadata;
  const auto config = md.find(kLlamaConfigKey);
  HT_CHECK(config != md.end(), "{}: model.safetensors does not record a Llama config ({}): it is not a checkpoint of "
                               "a language-model run",
           (dir / "model.safetensors").string(), kLlamaConfigKey);
  src.kind = LlamaSource::Kind::checkpoint;
  src.dir = dir;
  src.metadata = md;
  const fs::path file = dir / "model.safetensors";
  src.config = io::read_json_metadata(md, kLlamaConfigKey, file, [&](const nlohmann::json& j) {
    return models::LlamaConfig::from_json(j, file.string());
  });
  if (md.count(kLoraKey)) src.lora = io::read_json_metadata(md, kLoraKey, file, lora_from_json);
  if (const auto tok = md.find(kTokenizerKey); tok != md.end()) src.tokenizer = tok->second;
  if (const auto fp = md.find(kTokenizerFingerprintKey); fp != md.end()) src.tokenizer_fingerprint = fp->second;
  if (const auto f = md.find(kChatFormatKey); f != md.end()) {
    HT_CHECK(f->second == "llama3" || f->second == "llama2", "{}: {} holds '{}', expected llama3 or llama2 (the chat "
             "template the run's rows were made with)", file.string(), kChatFormatKey, f->second);
    src.chat_format = f->second;
  }
  if (const auto n = md.find(kTokenizerVocabSizeKey); n != md.end()) {
    const std::string& text = n->second;
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    HT_CHECK(ec == std::errc() && end == text.data() + text.size() && v > 0,
             "{}: {} holds '{}', expected a positive integer (the number of ids of the run's tokenizer)", file.string(),
             kTokenizerVocabSizeKey, text);
    src.tokenizer_vocab_size = v;
  }
  return src;
}

std::shared_ptr<models::Llama> load_llama_source(const LlamaSource& src, Device device) {
  Generator gen(0);
  auto model = build_llama(src.config, src.lora, true, gen, std::make_shared<Generator>(0));
  const std::map<std::string, Tensor> tensors = source_tensors(src);
  if (!src.peft.empty()) {
    models::load_hf_tensors(*model, tensors, src.dir.string());
    load_peft_tensors(*model, read_peft_folder(src.peft));
  } else if (src.lora) {
    // The base weights through the HF reader's checks, then the adapters.
    std::map<std::string, Tensor> base, adapters;
    for (const auto& [name, t] : tensors)
      (nn::is_lora_adapter_name(name) ? adapters : base)[name] = t;
    models::load_hf_tensors(*model, base, src.dir.string());
    model->load_state_dict(adapters, nn::StrictLoad::no);
  } else {
    models::load_hf_tensors(*model, tensors, src.dir.string());
  }
  model->to(device);
  return model;
}

RecordedTokenizer recorded_tokenizer(const LlamaSource& src) {
  std::error_code ec;
  if (src.kind == LlamaSource::Kind::checkpoint)
    return {src.tokenizer, fmt::format("the tokenizer {} records", (src.dir / "model.safetensors").string())};
  if (fs::exists(src.dir / "tokenizer.json", ec) || fs::exists(src.dir / "tokenizer.model", ec))
    return {src.dir, fmt::format("the tokenizer of {}", src.dir.string())};
  return {};
}

std::unique_ptr<data::Tokenizer> load_tokenizer_for(const fs::path& path, int64_t model_vocab,
                                                    const TokenizerOrigin& origin) {
  std::error_code ec;
  const fs::path expanded = expand_home(path.string());
  HT_CHECK(!expanded.empty(), "{}: no tokenizer path given", origin.what);
  HT_CHECK(fs::exists(expanded, ec), "{}: {} does not exist (expected a tokenizer.json, a SentencePiece model or a "
           "folder holding one)", origin.what, path.string());
  std::unique_ptr<data::Tokenizer> tok;
  try {
    tok = data::load_tokenizer(expanded);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {} is not a tokenizer hadatrain can load: {}", origin.what, path.string(), e.what()));
  }
  // Note [Tokenizer and model vocabularies]
  HT_CHECK(tok->vocab_size() <= model_vocab, "{}: the tokenizer {} has {} ids, more than the {} of the model {} "
           "(vocab_size): ids from {} on have no embedding row, so it is not this model's tokenizer", origin.what,
           path.string(), tok->vocab_size(), model_vocab, origin.model, model_vocab);
  return tok;
}

}  // namespace ht::train
