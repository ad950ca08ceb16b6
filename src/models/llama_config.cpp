// LlamaConfig: validation, parameter count, presets and HF config.json reading and writing. config.json
// carries the rotary settings either as transformers 4's top-level rope_theta + rope_scaling or as
// transformers 5's rope_parameters object; both are read, the first is written (what every Hub checkpoint
// has and both versions load).
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "hadatrain/models/llama.h"

namespace ht::models {
namespace {
using nlohmann::json;

const char* dtype_key(DType dt) {
  switch (dt) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::f64: return "float64";
    default: HT_FAIL("LlamaConfig: dtype {} has no torch_dtype name (use f32, bf16, f16 or f64)", dtype_name(dt));
  }
}

DType dtype_from_key(const std::string& s, const std::string& file, const std::string& key) {
  if (s == "float32") return DType::f32;
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16") return DType::f16;
  if (s == "float64") return DType::f64;
  HT_FAIL("{}: '{}' is \"{}\"; expected float32, bfloat16, float16 or float64", file, key, s);
}

// Typed reads of one key: absent keys keep the default, a present key of the wrong type names the file.
struct Reader {
  const json& j;
  const std::string& file;
  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t integer(const char* key, int64_t dflt, bool required = false) const {
    if (!has(key)) {
      HT_CHECK(!required, "{}: required key '{}' is missing", file, key);
      return dflt;
    }
    HT_CHECK(j[key].is_number_integer(), "{}: '{}' must be an integer, got {}", file, key, j[key].dump());
    return j[key].get<int64_t>();
  }
  double number(const json& obj, const char* key, double dflt) const {
    if (!obj.contains(key) || obj[key].is_null()) return dflt;
    HT_CHECK(obj[key].is_number(), "{}: '{}' must be a number, got {}", file, key, obj[key].dump());
    return obj[key].get<double>();
  }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    HT_CHECK(j[key].is_boolean(), "{}: '{}' must be true or false, got {}", file, key, j[key].dump());
    return j[key].get<bool>();
  }
};

// rope_scaling (transformers 4) or rope_parameters (5): {"rope_type" | "type": ..., factor, ...}.
void read_rope(const Reader& r, const json& obj, const char* key, LlamaConfig& c) {
  HT_CHECK(obj.is_object(), "{}: '{}' must be an object or null, got {}", r.file, key, obj.dump());
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (obj.contains(k) && obj[k].is_string()) type = obj[k].get<std::string>();
  if (obj.contains("rope_theta")) c.rope_theta = r.number(obj, "rope_theta", c.rope_theta);
  if (type == "default") return;
  HT_CHECK(type == "llama3", "{}: '{}' has rope type \"{}\"; only \"llama3\" (and \"default\") are supported",
           r.file, key, type);
  RopeScaling& s = c.rope_scaling;
  s.type = RopeScalingType::llama3;
  s.factor = r.number(obj, "factor", s.factor);
  s.low_freq_factor = r.number(obj, "low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = r.number(obj, "high_freq_factor", s.high_freq_factor);
  const double orig = r.number(obj, "original_max_position_embeddings",
                               static_cast<double>(s.original_max_position_embeddings));
  HT_CHECK(orig >= 1.0 && orig <= 0x1p53 && orig == std::floor(orig),
           "{}: '{}.original_max_position_embeddings' must be a whole number from 1 to 2^53, got {}", r.file, key,
           orig);
  s.original_max_position_embeddings = static_cast<int64_t>(orig);
}

// The parameter count, or nullopt when it exceeds int64: the sizes come from files (config.json, a llama2.c
// header), and validate() refuses a config whose tensors no int64 element count describes.
std::optional<int64_t> parameter_count(const LlamaConfig& c) {
  bool overflow = false;
  auto mul = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    overflow |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    overflow |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  const int64_t H = c.hidden_size, hd = c.resolved_head_dim();
  // q and o: H·heads·hd each; k and v: H·kv_heads·hd each
  const int64_t attn = mul(mul(mul(H, add(c.num_attention_heads, c.num_key_value_heads)), hd), 2);
  const int64_t layer = add(add(attn, mul(mul(3, H), c.intermediate_size)), mul(2, H));
  const int64_t embeddings = mul(mul(c.vocab_size, H), c.tie_word_embeddings ? 1 : 2);
  const int64_t n = add(add(embeddings, mul(c.num_hidden_layers, layer)), H);
  if (overflow) return std::nullopt;
  return n;
}

std::string too_many_parameters(const LlamaConfig& c) {
  return fmt::format("vocab_size {}, hidden_size {}, intermediate_size {}, {} layers and {} + {} heads of {} describe "
                     "more than 2^63 - 1 parameters", c.vocab_size, c.hidden_size, c.intermediate_size,
                     c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.resolved_head_dim());
}

}  // namespace

int64_t LlamaConfig::resolved_head_dim() const {
  return head_dim > 0 ? head_dim : (num_attention_heads > 0 ? hidden_size / num_attention_heads : 0);
}

void LlamaConfig::validate(const std::string& where) const {
  auto positive = [&](int64_t v, const char* key) {
    HT_CHECK(v > 0, "{}: '{}' must be positive, got {}", where, key, v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(max_position_embeddings, "max_position_embeddings");
  HT_CHECK(num_attention_heads % num_key_value_heads == 0,
           "{}: 'num_attention_heads' {} must be a multiple of 'num_key_value_heads' {}", where, num_attention_heads,
           num_key_value_heads);
  HT_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0,
           "{}: 'hidden_size' {} is not divisible by 'num_attention_heads' {} and no 'head_dim' is given", where,
           hidden_size, num_attention_heads);
  HT_CHECK(resolved_head_dim() % 2 == 0, "{}: the head dim {} must be even for rotary embeddings ('head_dim')",
           where, resolved_head_dim());
  HT_CHECK(rms_norm_eps > 0.0, "{}: 'rms_norm_eps' must be positive, got {}", where, rms_norm_eps);
  HT_CHECK(rope_theta > 0.0, "{}: 'rope_theta' must be positive, got {}", where, rope_theta);
  if (rope_scaling.type == RopeScalingType::llama3) {
    const RopeScaling& s = rope_scaling;
    HT_CHECK(s.factor > 0.0 && s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor &&
                 s.original_max_position_embeddings > 0,
             "{}: 'rope_scaling' needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
             "original_max_position_embeddings > 0, got factor {}, low_freq_factor {}, high_freq_factor {}, "
             "original_max_position_embeddings {}",
             where, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings);
  }
  HT_CHECK(initializer_range > 0.0, "{}: 'initializer_range' must be positive, got {}", where, initializer_range);
  auto token = [&](int64_t id, const char* key) {
    HT_CHECK(id >= 0 && id < vocab_size, "{}: '{}' {} is outside the vocabulary [0, {})", where, key, id, vocab_size);
  };
  token(bos_token_id, "bos_token_id");
  for (int64_t e : eos_token_ids) token(e, "eos_token_id");
  if (pad_token_id) token(*pad_token_id, "pad_token_id");
  HT_CHECK(parameter_count(*this).has_value(), "{}: {}", where, too_many_parameters(*this));
}

int64_t LlamaConfig::num_parameters() const {
  const std::optional<int64_t> n = parameter_count(*this);
  HT_CHECK(n.has_value(), "LlamaConfig: {}", too_many_parameters(*this));
  return *n;
}

LlamaConfig LlamaConfig::from_json(const json& j, const std::string& file) {
  HT_CHECK(j.is_object(), "{}: expected a JSON object", file);
  const Reader r{j, file};
  if (j.contains("model_type") && j["model_type"].is_string())
    HT_CHECK(j["model_type"] == "llama", "{}: 'model_type' is {}; expected \"llama\"", file, j["model_type"].dump());
  LlamaConfig c;
  c.vocab_size = r.integer("vocab_size", 0, true);
  c.hidden_size = r.integer("hidden_size", 0, true);
  c.intermediate_size = r.integer("intermediate_size", 0, true);
  c.num_hidden_layers = r.integer("num_hidden_layers", 0, true);
  c.num_attention_heads = r.integer("num_attention_heads", 0, true);
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  c.head_dim = r.integer("head_dim", 0);
  c.max_position_embeddings = r.integer("max_position_embeddings", 2048);
  c.rms_norm_eps = r.number(j, "rms_norm_eps", 1e-6);
  c.rope_theta = r.number(j, "rope_theta", 10000.0);
  if (r.has("rope_scaling")) read_rope(r, j["rope_scaling"], "rope_scaling", c);
  if (r.has("rope_parameters")) read_rope(r, j["rope_parameters"], "rope_parameters", c);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.initializer_range = r.number(j, "initializer_range", 0.02);
  if (r.has("hidden_act")) {
    HT_CHECK(j["hidden_act"] == "silu", "{}: 'hidden_act' is {}; LLaMA uses \"silu\"", file, j["hidden_act"].dump());
  }
  HT_CHECK(!r.boolean("attention_bias", false), "{}: 'attention_bias' true is not supported (LLaMA has no biases)",
           file);
  HT_CHECK(!r.boolean("mlp_bias", false), "{}: 'mlp_bias' true is not supported (LLaMA has no biases)", file);
  c.bos_token_id = r.integer("bos_token_id", 1);
  c.eos_token_ids.clear();
  if (r.has("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_array()) {
      for (const json& v : e) {
        HT_CHECK(v.is_number_integer(), "{}: 'eos_token_id' must hold integers, got {}", file, e.dump());
        c.eos_token_ids.push_back(v.get<int64_t>());
      }
    } else {
      c.eos_token_ids.push_back(r.integer("eos_token_id", 2));
    }
  } else {
    c.eos_token_ids.push_back(2);
  }
  if (r.has("pad_token_id")) c.pad_token_id = r.integer("pad_token_id", 0);
  for (const char* key : {"torch_dtype", "dtype"})
    if (r.has(key)) {
      HT_CHECK(j[key].is_string(), "{}: '{}' must be a string, got {}", file, key, j[key].dump());
      c.dtype = dtype_from_key(j[key].get<std::string>(), file, key);
    }
  c.validate(file);
  return c;
}

LlamaConfig LlamaConfig::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "cannot open '{}'", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    HT_FAIL("{}: invalid JSON: {}", path.string(), e.what());
  }
  return from_json(j, path.string());
}

json LlamaConfig::to_json() const {
  json j;
  j["architectures"] = json::array({"LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = resolved_head_dim();
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_scaling.type == RopeScalingType::llama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["initializer_range"] = initializer_range;
  j["use_cache"] = true;
  j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  j["torch_dtype"] = dtype_key(dtype);
  j["dtype"] = dtype_key(dtype);
  return j;
}

LlamaConfig LlamaConfig::tiny() {
  LlamaConfig c;
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  return c;
}

LlamaConfig LlamaConfig::sotu_small() {
  LlamaConfig c;  // ~31M parameters: 12.3M in the tied embedding, 1.57M per layer
  c.vocab_size = 32000;
  c.hidden_size = 384;
  c.intermediate_size = 1024;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  return c;
}

LlamaConfig LlamaConfig::llama32_1b() {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScalingType::llama3, 32.0, 1.0, 4.0, 8192};
  c.tie_word_embeddings = true;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};
  c.dtype = DType::bf16;
  return c;
}

LlamaConfig LlamaConfig::llama3_8b() {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScalingType::llama3, 8.0, 1.0, 4.0, 8192};
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};
  c.dtype = DType::bf16;
  return c;
}

LlamaConfig LlamaConfig::preset(const std::string& name) {
  if (name == "tiny") return tiny();
  if (name == "sotu_small") return sotu_small();
  if (name == "llama32_1b") return llama32_1b();
  if (name == "llama3_8b") return llama3_8b();
  HT_FAIL("unknown LLaMA preset '{}'; presets: tiny, sotu_small, llama32_1b, llama3_8b", name);
}

}  // namespace ht::models
