// LLaMA model: HF parameter names, config.json reading and its errors, presets, stories260K's logits against
// an independent float64 implementation of llama2.c's run.c (tools/golden/llama2c_reference.py), KV-cache
// decoding against the full-sequence forward, Llama-3 rope scaling, and generation.
#include <filesystem>
#include <fstream>
#include <limits>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/models/llama_generate.h"
#include "hadatrain/ops/ops.h"

using namespace ht;
using models::Llama;
using models::LlamaConfig;
namespace fs = std::filesystem;

namespace {

// The stories260K checkpoint lives outside the repository, in ../shared/data beside the checkout (tests run
// in the repository root).
fs::path stories260k() {
  const fs::path p = fs::path("..") / "shared" / "data" / "stories260K.bin";
  INFO("stories260K.bin is missing: expected at " << fs::absolute(p).string()
       << " (reference/data-formats.md §8; tools/setup.sh fetches nothing for it: copy the shared data folder "
          "beside the checkout)");
  REQUIRE(fs::is_regular_file(p));
  return p;
}

std::shared_ptr<Llama> random_llama(const LlamaConfig& c, uint64_t seed, DType dtype = DType::f64) {
  Generator gen(seed);
  return std::make_shared<Llama>(c, models::LlamaBuild{models::LlamaInit::normal, &gen, {}, dtype});
}

Tensor ids_tensor(const std::vector<int64_t>& ids, int64_t B, int64_t T) { return from_vector(ids, {B, T}, {DType::i64}); }

}  // namespace

TEST_CASE("Llama parameters carry Hugging Face's names and shapes", "[llama]") {
  LlamaConfig c = LlamaConfig::tiny();
  for (bool tied : {false, true}) {
    c.tie_word_embeddings = tied;
    auto m = random_llama(c, 1);
    std::map<std::string, Shape> got;
    for (auto& [name, t] : m->named_parameters()) got[name] = t->shape();
    CHECK(got == models::hf_llama_shapes(c));
    CHECK(got.count("lm_head.weight") == (tied ? 0u : 1u));
    CHECK(m->num_parameters() == c.num_parameters());
    CHECK(m->blocks().size() == static_cast<std::size_t>(c.num_hidden_layers));
  }
}

TEST_CASE("Llama presets have the documented sizes", "[llama]") {
  const int64_t sotu = LlamaConfig::sotu_small().num_parameters();
  CHECK(sotu > 25'000'000);
  CHECK(sotu < 40'000'000);
  // Llama-3.2-1B: 1,235,814,400 parameters (tied embedding).
  CHECK(LlamaConfig::llama32_1b().num_parameters() == 1'235'814'400);
  // Llama-3-8B: 8,030,261,248 parameters.
  CHECK(LlamaConfig::llama3_8b().num_parameters() == 8'030'261'248);
  CHECK_THROWS_WITH(LlamaConfig::preset("llama9"), HasSubstr("sotu_small"));
}

TEST_CASE("LlamaConfig reads and writes config.json", "[llama]") {
  LlamaConfig c = LlamaConfig::llama32_1b();
  const LlamaConfig back = LlamaConfig::from_json(c.to_json(), "mem");
  CHECK(back.to_json() == c.to_json());
  CHECK(back.rope_scaling.type == RopeScalingType::llama3);
  CHECK(back.eos_token_ids == std::vector<int64_t>{128001, 128008, 128009});
  CHECK(back.dtype == DType::bf16);
  CHECK(c.to_json()["architectures"][0] == "LlamaForCausalLM");

  // transformers 5 writes rope_parameters instead of rope_theta / rope_scaling.
  nlohmann::json j = LlamaConfig::tiny().to_json();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 5e5}, {"factor", 4.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 2.0}, {"original_max_position_embeddings", 128}};
  const LlamaConfig v5 = LlamaConfig::from_json(j, "v5.json");
  CHECK(v5.rope_theta == 5e5);
  CHECK(v5.rope_scaling.factor == 4.0);
  CHECK(v5.rope_scaling.original_max_position_embeddings == 128);

  nlohmann::json bad = LlamaConfig::tiny().to_json();
  bad.erase("hidden_size");
  CHECK_THROWS_WITH(LlamaConfig::from_json(bad, "dir/config.json"),
                    HasSubstr("dir/config.json") && HasSubstr("'hidden_size'") && HasSubstr("missing"));
  bad = LlamaConfig::tiny().to_json();
  bad["num_key_value_heads"] = 3;
  CHECK_THROWS_WITH(LlamaConfig::from_json(bad, "c.json"), HasSubstr("c.json") && HasSubstr("num_key_value_heads"));
  bad = LlamaConfig::tiny().to_json();
  bad["rms_norm_eps"] = "small";
  CHECK_THROWS_WITH(LlamaConfig::from_json(bad, "c.json"), HasSubstr("'rms_norm_eps' must be a number"));
  bad = LlamaConfig::tiny().to_json();
  bad["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  CHECK_THROWS_WITH(LlamaConfig::from_json(bad, "c.json"), HasSubstr("yarn"));
  bad = LlamaConfig::tiny().to_json();
  bad["hidden_act"] = "gelu";
  CHECK_THROWS_WITH(LlamaConfig::from_json(bad, "c.json"), HasSubstr("hidden_act"));
  bad = LlamaConfig::tiny().to_json();
  bad["eos_token_id"] = 999;
  CHECK_THROWS_WITH(LlamaConfig::from_json(bad, "c.json"), HasSubstr("eos_token_id") && HasSubstr("vocabulary"));
}

TEST_CASE("llama3 rope scaling keeps high, divides low and blends medium frequencies", "[llama][rotary]") {
  RopeParams p;
  p.theta = 10000.0;
  p.scaling = {RopeScalingType::llama3, 8.0, 1.0, 4.0, 64};
  const std::vector<double> plain = rope_inv_freq(RopeParams{}, 16), scaled = rope_inv_freq(p, 16);
  REQUIRE(scaled.size() == 8u);
  // wavelengths 2 pi / f: 6.3 (< 16: kept), 19.9 and 62.8 (in [16, 64]: blended), 199 and up (> 64: / 8).
  CHECK(scaled[0] == plain[0]);
  for (std::size_t j = 3; j < 8; ++j) CHECK(scaled[j] == Approx(plain[j] / 8.0).epsilon(1e-15));
  for (std::size_t j : {1u, 2u}) {
    const double s = (64.0 / (2.0 * M_PI / plain[j]) - 1.0) / 3.0;
    CHECK(scaled[j] == Approx((1.0 - s) * plain[j] / 8.0 + s * plain[j]).epsilon(1e-15));
  }
}

TEST_CASE("stories260K imported from llama2.c gives run.c's logits", "[llama][llama2c]") {
  const models::Llama2cModel m = models::read_llama2c(stories260k());
  CHECK(m.version == 0);
  CHECK(m.config.hidden_size == 64);
  CHECK(m.config.num_hidden_layers == 5);
  CHECK(m.config.num_attention_heads == 8);
  CHECK(m.config.num_key_value_heads == 4);
  CHECK(m.config.vocab_size == 512);
  CHECK(m.config.tie_word_embeddings);
  Llama model(m.config, {models::LlamaInit::none, nullptr, {}, DType::f64});
  models::load_hf_tensors(model, m.tensors, "stories260K");
  const io::SafetensorsContents ref = io::load_safetensors("tests/fixtures/llama_stories260k_logits.safetensors");
  const Tensor ids = ref.at("ids");  // (T)
  const int64_t T = ids.numel();
  NoGradGuard ng;
  const Tensor logits = model.forward(reshape(ids, {1, T}));  // (1, T, 512)
  // The reference is float64 from f32 weights; the two implementations round differently only in float64.
  CHECK(test::compare(reshape(logits, {T, 512}), ref.at("logits"), 1e-10, 1e-10) == "");
}

TEST_CASE("KV-cache decoding gives the full-sequence logits", "[llama][kv_cache]") {
  LlamaConfig c = LlamaConfig::tiny();
  c.rope_scaling = {RopeScalingType::llama3, 4.0, 1.0, 4.0, 32};
  auto m = random_llama(c, 3);
  m->eval();
  const int64_t B = 2, T = 9;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < B * T; ++i) ids.push_back((i * 37 + 5) % c.vocab_size);
  NoGradGuard ng;
  const Tensor full = m->forward(ids_tensor(ids, B, T));  // (B, T, V)
  models::KvCache cache = m->make_kv_cache(B, 16);
  const Tensor all = ids_tensor(ids, B, T);
  // A prompt of 4 tokens, then 2, then one at a time.
  std::vector<Tensor> parts{m->forward(narrow(all, 1, 0, 4), &cache, 0), m->forward(narrow(all, 1, 4, 2), &cache, 4)};
  for (int64_t t = 6; t < T; ++t) parts.push_back(m->forward(narrow(all, 1, t, 1), &cache, t));
  CHECK(cache.length == T);
  CHECK(test::compare(cat(parts, 1), full, 1e-12, 1e-12) == "");
  CHECK_THROWS_WITH(m->forward(narrow(all, 1, 0, 1), &cache, T + 1), HasSubstr("gap"));
}

TEST_CASE("greedy generation follows the argmax of the full-sequence forward", "[llama][generate]") {
  LlamaConfig c = LlamaConfig::tiny();
  c.eos_token_ids = {127};
  auto m = random_llama(c, 4);
  const std::vector<int64_t> prompt{1, 17, 33};
  models::GenerateOptions o;
  o.max_new_tokens = 6;
  o.stop_ids = {static_cast<int64_t>(c.vocab_size)};  // never emitted: run the full length
  const models::GenerateResult r = models::generate(*m, prompt, o);
  REQUIRE(r.tokens.size() == 6u);
  CHECK(r.reason == models::StopReason::max_new_tokens);
  std::vector<int64_t> seq = prompt;
  NoGradGuard ng;
  for (int64_t step = 0; step < 6; ++step) {
    const int64_t T = static_cast<int64_t>(seq.size());
    const Tensor last = select(select(m->forward(ids_tensor(seq, 1, T)), 0, 0), 0, T - 1);
    seq.push_back(static_cast<int64_t>(argmax(last, 0).item()));
    CHECK(r.tokens[static_cast<std::size_t>(step)] == seq.back());
  }
  // Stopping at a stop token, which is part of the result.
  o.stop_ids = {r.tokens[2]};
  const models::GenerateResult s = models::generate(*m, prompt, o);
  CHECK(s.reason == models::StopReason::stop_token);
  CHECK(s.tokens.back() == r.tokens[2]);
  CHECK(s.tokens.size() <= 3u);
  CHECK_THROWS_WITH(models::generate(*m, {1, 999}, o), HasSubstr("vocabulary"));
}

TEST_CASE("sampling: temperature, top-p and seeds", "[llama][generate]") {
  const Tensor logits = from_vector(std::vector<double>{0.0, 2.0, 1.0, -1.0, 2.0}, {5}, {DType::f64});
  models::SamplingOptions greedy;
  CHECK(models::sample_token(logits, greedy, 0) == 1);  // the first of the two maxima
  models::SamplingOptions o;
  o.temperature = 1.0;
  o.seed = 11;
  std::vector<int> counts(5);
  for (uint64_t step = 0; step < 4000; ++step) ++counts[static_cast<std::size_t>(models::sample_token(logits, o, step))];
  // softmax of (0, 2, 1, -1, 2): 0.0530, 0.3917, 0.1441, 0.0195, 0.3917
  CHECK(counts[1] / 4000.0 == Approx(0.3917).margin(0.03));
  CHECK(counts[2] / 4000.0 == Approx(0.1441).margin(0.02));
  CHECK(counts[3] / 4000.0 == Approx(0.0195).margin(0.01));
  CHECK(counts[3] > 0);
  // top_p 0.75: the nucleus is {1, 4} (0.783); nothing else is drawn, and the two share the mass.
  o.top_p = 0.75;
  std::fill(counts.begin(), counts.end(), 0);
  for (uint64_t step = 0; step < 2000; ++step) ++counts[static_cast<std::size_t>(models::sample_token(logits, o, step))];
  CHECK(counts[0] + counts[2] + counts[3] == 0);
  CHECK(counts[1] / 2000.0 == Approx(0.5).margin(0.05));
  // Same seed and step: same token; the draw depends only on (seed, step).
  for (uint64_t step = 0; step < 50; ++step) CHECK(models::sample_token(logits, o, step) == models::sample_token(logits, o, step));
  o.temperature = 1e-6;  // a near-zero temperature concentrates on the maxima
  o.top_p = 1.0;
  for (uint64_t step = 0; step < 20; ++step) {
    const int64_t t = models::sample_token(logits, o, step);
    CHECK((t == 1 || t == 4));
  }
}

TEST_CASE("sampling with vocab_limit draws only ids below it", "[llama][generate]") {
  // The two largest logits are ids 5 and 6, past a limit of 5 (a padded embedding's rows).
  const Tensor logits = from_vector(std::vector<double>{0.0, 1.0, 0.5, -1.0, 0.2, 9.0, 8.0}, {7}, {DType::f64});
  models::SamplingOptions o;
  o.vocab_limit = 5;
  CHECK(models::sample_token(logits, o, 0) == 1);  // greedy: the argmax of ids 0..4
  o.temperature = 1.0;
  std::vector<int> counts(7);
  for (uint64_t step = 0; step < 2000; ++step) ++counts[static_cast<std::size_t>(models::sample_token(logits, o, step))];
  CHECK(counts[5] + counts[6] == 0);
  // softmax of (0, 1, 0.5, -1, 0.2) over the five: id 1 has 0.3908
  CHECK(counts[1] / 2000.0 == Approx(0.3908).margin(0.03));
  CHECK(counts[3] > 0);
  // Without the limit the two large logits take almost every draw.
  o.vocab_limit = 0;
  int past = 0;
  for (uint64_t step = 0; step < 200; ++step) past += models::sample_token(logits, o, step) >= 5;
  CHECK(past > 190);
  o.vocab_limit = 8;
  CHECK_THROWS_WITH(models::sample_token(logits, o, 0), HasSubstr("vocab_limit must be in [0, 7]"));
}

TEST_CASE("generate's inputs are checked before any token is computed", "[llama][generate]") {
  LlamaConfig c = LlamaConfig::tiny();  // 128 ids, 256 positions
  models::GenerateOptions o;
  o.max_new_tokens = 10;
  CHECK(models::check_generate_inputs(c, {1, 2, 3}, o) == 13);
  // A request past the positions is bounded by them, without overflowing prompt + max_new_tokens.
  o.max_new_tokens = std::numeric_limits<int64_t>::max();
  CHECK(models::check_generate_inputs(c, {1, 2, 3}, o) == 256);
  const std::vector<int64_t> long_prompt(257, 5);
  CHECK_THROWS_WITH(models::check_generate_inputs(c, long_prompt, o),
                    HasSubstr("the prompt has 257 tokens, more than the 256 positions available"));
  o.max_new_tokens = 4;
  o.sampling.temperature = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(models::check_generate_inputs(c, {1}, o), HasSubstr("temperature must be a finite number"));
  o.sampling.temperature = 0.0;
  o.sampling.vocab_limit = 129;
  CHECK_THROWS_WITH(models::check_generate_inputs(c, {1}, o), HasSubstr("vocab_limit must be in [0, 128]"));
  o.sampling.vocab_limit = 0;
  CHECK_THROWS_WITH(models::check_generate_inputs(c, {1, 128}, o), HasSubstr("outside the vocabulary [0, 128)"));
}

TEST_CASE("Llama computes in the compute dtype and its bf16 logits follow f32", "[llama]") {
  auto m = random_llama(LlamaConfig::tiny(), 5, DType::f32);
  std::vector<int64_t> ids{1, 2, 3, 4, 5, 6};
  NoGradGuard ng;
  const Tensor f32 = m->forward(ids_tensor(ids, 1, 6));
  CHECK(f32.dtype() == DType::f32);
  m->compute_dtype = DType::bf16;
  const Tensor bf = m->forward(ids_tensor(ids, 1, 6));
  CHECK(bf.dtype() == DType::bf16);
  CHECK(test::compare(to_dtype(bf, DType::f32), f32, 0.05, 0.05) == "");
}
