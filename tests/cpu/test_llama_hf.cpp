// Hugging Face LLaMA folders: write and read back (one file and shards, bf16 and f32, tied and untied), the
// tokenizer files carried along (a file under its standard name, a folder's files), the errors for bad folders (config.json against the tensors, truncated shard, index naming a missing file,
// missing and unexpected tensors), and llama2.c imports (v0 with a separate classifier, v1) written here from
// a model in HF layout through the inverse q/k permutation.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/data/tokenizer.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/ops/ops.h"

using namespace ht;
using models::Llama;
using models::LlamaConfig;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<Llama> random_llama(const LlamaConfig& c, uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<Llama>(c, models::LlamaBuild{models::LlamaInit::normal, &gen, {}, DType::f32});
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
using test::read_text;

// The shard files the folder's index names, sorted.
std::vector<std::string> shard_files(const fs::path& dir) {
  std::set<std::string> files;
  const nlohmann::json index = nlohmann::json::parse(read_text(dir / "model.safetensors.index.json"));
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  return {files.begin(), files.end()};
}

void check_same_tensors(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want, DType dt) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    CHECK(got.at(name).dtype() == dt);
    CHECK(test::compare(got.at(name), to_dtype(t, dt), 0, 0) == "");
  }
}

}  // namespace

TEST_CASE("HF checkpoints round-trip: one file and shards, bf16 and f32", "[llama][hf]") {
  test::TempDir tmp("hf_roundtrip");
  for (bool tied : {false, true}) {
    LlamaConfig c = LlamaConfig::tiny();
    c.tie_word_embeddings = tied;
    auto m = random_llama(c, tied ? 7 : 8);
    const std::map<std::string, Tensor> sd = models::hf_state_dict(*m);
    write_text(tmp.path / "tokenizer.json", "{\"model\": {}}");
    for (DType dt : {DType::bf16, DType::f32}) {
      for (uint64_t shard : {uint64_t{1} << 30, uint64_t{20000}}) {
        INFO("tied " << tied << ", dtype " << dtype_name(dt) << ", max shard bytes " << shard);
        const fs::path dir = tmp.path / "out";
        models::HfWriteOptions o;
        o.dtype = dt;
        o.max_shard_bytes = shard;
        o.copy_tokenizer_from = tmp.path;
        models::save_hf_checkpoint(dir, *m, o);
        const bool sharded = shard < (uint64_t{1} << 30);
        CHECK(fs::exists(dir / "model.safetensors.index.json") == sharded);
        CHECK(fs::exists(dir / "model.safetensors") == !sharded);  // the other layout's files are gone
        if (sharded) {
          const std::vector<std::string> files = shard_files(dir);
          REQUIRE(files.size() >= 2u);
          CHECK(files[0] == fmt::format("model-00001-of-{:05d}.safetensors", files.size()));
          for (const std::string& f : files) CHECK(fs::exists(dir / f));
        }
        CHECK(read_text(dir / "tokenizer.json") == "{\"model\": {}}");
        const nlohmann::json cj = nlohmann::json::parse(read_text(dir / "config.json"));
        CHECK(cj["torch_dtype"] == (dt == DType::bf16 ? "bfloat16" : "float32"));
        CHECK(cj["model_type"] == "llama");
        const models::HfWeights w = models::read_hf_weights(dir);
        LlamaConfig written = c;
        written.dtype = dt;
        CHECK(w.config.to_json() == written.to_json());
        check_same_tensors(w.tensors, sd, dt);
        // A model loaded from the folder holds the written weights.
        auto loaded = models::load_hf_llama(dir, {models::LlamaInit::none, nullptr, {}, DType::f32});
        check_same_tensors(models::hf_state_dict(*loaded), w.tensors, DType::f32);
      }
    }
  }
}

TEST_CASE("a tokenizer file is carried into an HF folder under its standard name", "[llama][hf][tokenizer]") {
  test::TempDir tmp("hf_tokenizer");
  const LlamaConfig c = LlamaConfig::tiny();
  auto m = random_llama(c, 9);
  const std::string sp = read_text("tests/fixtures/lm_char.model");
  REQUIRE(!sp.empty());
  fs::create_directories(tmp.path / "run");
  write_text(tmp.path / "run" / "lm_char.model", sp);          // a SentencePiece model under another name
  write_text(tmp.path / "run" / "tokenizer_config.json", "{}");  // not the SentencePiece model's: stays behind
  write_text(tmp.path / "my_bpe.json", "{\"model\": {}}");
  write_text(tmp.path / "tokenizer_config.json", "{\"eos_token\": \"x\"}");  // beside my_bpe.json: read with it
  auto files_of = [](const fs::path& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
  };

  models::HfWriteOptions o;
  o.copy_tokenizer_from = tmp.path / "run" / "lm_char.model";
  models::save_hf_checkpoint(tmp.path / "hf_sp", *m, o);
  CHECK(files_of(tmp.path / "hf_sp") == std::set<std::string>{"config.json", "model.safetensors", "tokenizer.model"});
  CHECK(read_text(tmp.path / "hf_sp" / "tokenizer.model") == sp);
  if (data::tokenizer_engine_built("sentencepiece"))  // the folder is a tokenizer now: the 80 pieces
    CHECK(data::load_tokenizer(tmp.path / "hf_sp")->vocab_size() == 80);

  o.copy_tokenizer_from = tmp.path / "my_bpe.json";
  models::save_hf_checkpoint(tmp.path / "hf_json", *m, o);
  CHECK(files_of(tmp.path / "hf_json") ==
        std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"});
  CHECK(read_text(tmp.path / "hf_json" / "tokenizer.json") == "{\"model\": {}}");
  CHECK(read_text(tmp.path / "hf_json" / "tokenizer_config.json") == "{\"eos_token\": \"x\"}");

  // A folder's tokenizer files keep their names; writing into the tokenizer's own folder copies nothing onto itself.
  o.copy_tokenizer_from = tmp.path / "hf_json";
  models::save_hf_checkpoint(tmp.path / "hf_json", *m, o);
  CHECK(read_text(tmp.path / "hf_json" / "tokenizer.json") == "{\"model\": {}}");

  // A missing path and a folder without a tokenizer fail before anything is written.
  o.copy_tokenizer_from = tmp.path / "no" / "tok.model";
  CHECK_THAT(test::error_of([&] { models::save_hf_checkpoint(tmp.path / "hf_missing", *m, o); }),
             HasSubstr("tokenizer " + (tmp.path / "no" / "tok.model").string() + " does not exist"));
  CHECK_FALSE(fs::exists(tmp.path / "hf_missing"));
  fs::create_directories(tmp.path / "empty");
  o.copy_tokenizer_from = tmp.path / "empty";
  CHECK_THAT(test::error_of([&] { models::save_hf_checkpoint(tmp.path / "hf_empty", *m, o); }),
             HasSubstr("the folder " + (tmp.path / "empty").string() + " holds neither tokenizer.json nor tokenizer.model"));
  CHECK_FALSE(fs::exists(tmp.path / "hf_empty"));
}

TEST_CASE("bad HF folders give errors naming the file and the tensor", "[llama][hf]") {
  test::TempDir tmp("hf_bad");
  const LlamaConfig c = LlamaConfig::tiny();
  auto m = random_llama(c, 9);
  models::HfWriteOptions o;
  o.dtype = DType::f32;
  const fs::path one = tmp.path / "one", shards = tmp.path / "shards";
  models::save_hf_checkpoint(one, *m, o);
  o.max_shard_bytes = 20000;
  models::save_hf_checkpoint(shards, *m, o);

  SECTION("config.json disagrees with the tensor shapes") {
    nlohmann::json j = nlohmann::json::parse(read_text(one / "config.json"));
    j["intermediate_size"] = 96;
    write_text(one / "config.json", j.dump());
    CHECK_THROWS_WITH(models::read_hf_weights(one),
                      HasSubstr((one / "model.safetensors").string()) && HasSubstr("mlp.down_proj.weight") &&
                          HasSubstr("(64, 128)") && HasSubstr("(64, 96)") && HasSubstr("config.json"));
  }
  SECTION("a truncated shard") {
    const fs::path shard = shards / shard_files(shards).at(1);
    fs::resize_file(shard, fs::file_size(shard) - 100);
    CHECK_THROWS_WITH(models::read_hf_weights(shards), HasSubstr(shard.string()));
  }
  SECTION("an index naming a missing shard") {
    std::string index = read_text(shards / "model.safetensors.index.json");
    const std::string from = shard_files(shards).at(2);
    for (std::size_t p = index.find(from); p != std::string::npos; p = index.find(from))
      index.replace(p, from.size(), "model-00009-of-00009.safetensors");
    write_text(shards / "model.safetensors.index.json", index);
    CHECK_THROWS_WITH(models::read_hf_weights(shards),
                      HasSubstr("model-00009-of-00009.safetensors") && HasSubstr("does not exist"));
  }
  SECTION("missing and unexpected tensors are listed; rotary_emb.inv_freq is ignored") {
    std::map<std::string, Tensor> sd = models::hf_state_dict(*m);
    sd.erase("model.layers.1.mlp.up_proj.weight");
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = ones({8});
    sd["model.extra.weight"] = ones({3});
    io::TensorList list(sd.begin(), sd.end());
    io::save_safetensors(one / "model.safetensors", list);
    CHECK_THROWS_WITH(models::read_hf_weights(one), HasSubstr("missing tensors [model.layers.1.mlp.up_proj.weight]") &&
                                                    HasSubstr("unexpected tensors [model.extra.weight]"));
    sd.erase("model.extra.weight");
    sd["model.layers.1.mlp.up_proj.weight"] = m->blocks()[1]->mlp->up_proj->weight.detach();
    io::save_safetensors(one / "model.safetensors", io::TensorList(sd.begin(), sd.end()));
    CHECK(models::read_hf_weights(one).tensors.size() == models::hf_llama_shapes(c).size());
  }
  SECTION("a token id beyond the vocabulary") {
    NoGradGuard ng;
    CHECK_THROWS_WITH(m->forward(from_vector(std::vector<int64_t>{1, 128}, {1, 2}, {DType::i64})), HasSubstr("128"));
  }
  SECTION("no weights at all") {
    fs::remove(one / "model.safetensors");
    CHECK_THROWS_WITH(models::read_hf_weights(one), HasSubstr("holds neither model.safetensors"));
  }
}

namespace {

// Writes `m` as a llama2.c checkpoint: q/k rows back to the interleaved pairing, arrays in the version's order.
void write_llama2c(const fs::path& path, Llama& m, int version, bool shared) {
  const LlamaConfig& c = m.config;
  const std::map<std::string, Tensor> sd = models::hf_state_dict(m);
  std::ofstream out(path, std::ios::binary);
  const int32_t hdr[7] = {static_cast<int32_t>(c.hidden_size), static_cast<int32_t>(c.intermediate_size),
                          static_cast<int32_t>(c.num_hidden_layers), static_cast<int32_t>(c.num_attention_heads),
                          static_cast<int32_t>(c.num_key_value_heads),
                          static_cast<int32_t>(shared || version == 1 ? c.vocab_size : -c.vocab_size),
                          static_cast<int32_t>(c.max_position_embeddings)};
  if (version == 1) {
    const uint32_t magic = 0x616b3432u;
    const int32_t v = 1;
    out.write(reinterpret_cast<const char*>(&magic), 4);
    out.write(reinterpret_cast<const char*>(&v), 4);
    out.write(reinterpret_cast<const char*>(hdr), 28);
    const uint8_t s = shared ? 1 : 0;
    out.write(reinterpret_cast<const char*>(&s), 1);
    const std::string pad(256 - 37, '\0');
    out.write(pad.data(), static_cast<std::streamsize>(pad.size()));
  } else {
    out.write(reinterpret_cast<const char*>(hdr), 28);
  }
  auto put = [&](const Tensor& t) {
    const std::vector<float> v = t.to_vector<float>();
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  };
  auto layers = [&](const std::string& name) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      Tensor t = sd.at("model.layers." + std::to_string(i) + "." + name);
      if (name == "self_attn.q_proj.weight") t = models::rotate_half_to_interleaved(t, c.num_attention_heads);
      if (name == "self_attn.k_proj.weight") t = models::rotate_half_to_interleaved(t, c.num_key_value_heads);
      put(t);
    }
  };
  const char* attn[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                        "self_attn.o_proj.weight"};
  if (version == 0) {
    put(sd.at("model.embed_tokens.weight"));
    layers("input_layernorm.weight");
    for (const char* a : attn) layers(a);
    for (const char* n : {"post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.down_proj.weight",
                          "mlp.up_proj.weight"})
      layers(n);
    put(sd.at("model.norm.weight"));
    put(zeros({2 * c.max_position_embeddings * c.resolved_head_dim() / 2}));  // freq_cis tables
  } else {
    layers("input_layernorm.weight");
    layers("post_attention_layernorm.weight");
    put(sd.at("model.norm.weight"));
    put(sd.at("model.embed_tokens.weight"));
    for (const char* a : attn) layers(a);
    for (const char* n : {"mlp.gate_proj.weight", "mlp.down_proj.weight", "mlp.up_proj.weight"}) layers(n);
  }
  if (!shared) put(sd.at("lm_head.weight"));
}

}  // namespace

TEST_CASE("llama2.c v0 and v1 files import into HF layout", "[llama][llama2c]") {
  test::TempDir tmp("llama2c");
  for (int version : {0, 1})
    for (bool shared : {false, true}) {
      INFO("version " << version << ", shared classifier " << shared);
      LlamaConfig c = LlamaConfig::tiny();
      c.tie_word_embeddings = shared;
      c.max_position_embeddings = 32;
      c.head_dim = 16;
      c.rms_norm_eps = 1e-5;
      auto m = random_llama(c, 20 + version);
      const fs::path p = tmp.path / "m.bin";
      write_llama2c(p, *m, version, shared);
      const models::Llama2cModel got = models::read_llama2c(p);
      CHECK(got.version == version);
      CHECK(got.config.to_json() == c.to_json());
      check_same_tensors(got.tensors, models::hf_state_dict(*m), DType::f32);
      // A truncated file: the size check names both sizes.
      const uint64_t size = fs::file_size(p);
      fs::resize_file(p, size - 4);
      CHECK_THROWS_WITH(models::read_llama2c(p), HasSubstr(std::to_string(size) + " bytes, the file has " +
                                                       std::to_string(size - 4)));
    }
  // The permutation and its inverse: HF row h*hd + c*hd/2 + j is Meta row h*hd + 2j + c.
  const Tensor w = reshape(arange(2 * 8 * 3, {DType::f64}), {16, 3});  // 2 heads, hd 8
  const Tensor half = models::interleaved_to_rotate_half(w, 2);
  CHECK(half.to_vector<double>()[3 * (8 + 4 + 1)] == w.to_vector<double>()[3 * (8 + 2 * 1 + 1)]);
  CHECK(test::compare(models::rotate_half_to_interleaved(half, 2), w, 0, 0) == "");
}

TEST_CASE("headers and configs whose sizes overflow are refused with their values", "[llama][llama2c][hf]") {
  test::TempDir tmp("llama2c_overflow");
  const fs::path p = tmp.path / "m.bin";
  auto write_header = [&](std::vector<int32_t> h) {
    h.resize(7);
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(h.data()), 28);
    const std::string body(64, '\0');
    out.write(body.data(), static_cast<std::streamsize>(body.size()));
  };
  // A vocabulary of -2^31 (separate classifier): its negation overflowed.
  write_header({8, 16, 1, 2, 1, std::numeric_limits<int32_t>::min(), 4});
  CHECK_THROWS_WITH(models::read_llama2c(p), HasSubstr("implausible header") && HasSubstr("vocab_size -2147483648"));
  // Sizes near 2^30 whose weight count is beyond 2^64: it overflowed int64 (and could wrap to the file's size).
  write_header({1 << 30, 1 << 30, 1 << 30, 2, 1, 1 << 30, 4});
  CHECK_THROWS_WITH(models::read_llama2c(p), HasSubstr("implies 18446744073709551615 bytes, the file has 92"));

  nlohmann::json j = LlamaConfig::tiny().to_json();
  j["vocab_size"] = int64_t{3'000'000'000'000};
  j["hidden_size"] = int64_t{4'000'000'000};
  CHECK_THROWS_WITH(LlamaConfig::from_json(j, "big/config.json"),
                    HasSubstr("big/config.json") && HasSubstr("vocab_size 3000000000000") &&
                        HasSubstr("more than 2^63 - 1 parameters"));
  j = LlamaConfig::tiny().to_json();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 1e300}};
  CHECK_THROWS_WITH(LlamaConfig::from_json(j, "rope/config.json"),
                    HasSubstr("rope/config.json") && HasSubstr("'rope_scaling.original_max_position_embeddings'") &&
                        HasSubstr("whole number"));
  j["rope_scaling"]["original_max_position_embeddings"] = 8192;
  CHECK(LlamaConfig::from_json(j, "rope/config.json").rope_scaling.original_max_position_embeddings == 8192);
  // A tensor whose element or byte count overflows is refused before anything is allocated.
  CHECK_THROWS_WITH(empty({int64_t{1} << 40, int64_t{1} << 40}), HasSubstr("more than 2^63 - 1 elements"));
  CHECK_THROWS_WITH(empty({int64_t{1} << 62}, {DType::f32}), HasSubstr("more than 2^63 - 1 bytes"));
}
