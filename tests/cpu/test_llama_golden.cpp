// Golden tests against Hugging Face transformers' LlamaForCausalLM in float64 (tools/golden/llama_fixtures.py
// writes the fixtures with torch on the GPU machine): GQA with an lm_head, tied embeddings with multi-head
// attention, and Llama-3 rope scaling. Each fixture holds the config.json text, the weights, ids and labels,
// and transformers' logits, loss (next-token cross-entropy on labels shifted by one, ignore index -100) and
// every parameter's gradient; all are compared here at float64 tolerances.
#include <filesystem>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/ops/ops.h"

using namespace ht;
namespace fs = std::filesystem;

namespace {

void check_golden(const std::string& name) {
  const fs::path path = fs::path("tests/fixtures") / ("llama_golden_" + name + ".safetensors");
  if (!fs::is_regular_file(path))
    FAIL("fixture missing: " << path.string()
         << ": run tools/golden/llama_fixtures.py on a machine with transformers (from the repository root)");
  const io::SafetensorsContents f = io::load_safetensors(path);
  const models::LlamaConfig c =
      models::LlamaConfig::from_json(nlohmann::json::parse(f.metadata.at("config")), path.string() + " (config)");
  models::Llama model(c, {models::LlamaInit::none, nullptr, {}, DType::f64});
  std::map<std::string, Tensor> params;
  for (const auto& [k, t] : f.tensors)
    if (k.rfind("param.", 0) == 0) params[k.substr(6)] = t;
  models::load_hf_tensors(model, params, path.string());

  const Tensor ids = f.at("ids"), labels = f.at("labels");  // (B, T)
  const int64_t B = ids.size(0), T = ids.size(1), V = c.vocab_size;
  model.train();
  const Tensor logits = model.forward(ids);  // (B, T, V)
  CHECK(test::compare(logits, f.at("logits"), 1e-10, 1e-12) == "");
  // Position t predicts label t + 1.
  const Tensor loss = cross_entropy(reshape(narrow(logits, 1, 0, T - 1), {B * (T - 1), V}),
                                    reshape(narrow(labels, 1, 1, T - 1), {B * (T - 1)}));
  CHECK(loss.item() == Approx(f.at("loss").item()).epsilon(1e-12));
  loss.backward();
  int64_t compared = 0;
  for (auto& [pname, slot] : model.named_parameters()) {
    INFO(path.string() << ": gradient of " << pname);
    REQUIRE(f.contains("grad." + pname));
    REQUIRE(slot->grad().defined());
    CHECK(test::compare(slot->grad(), f.at("grad." + pname), 1e-9, 1e-13) == "");
    ++compared;
  }
  CHECK(compared == static_cast<int64_t>(models::hf_llama_shapes(c).size()));
}

}  // namespace

TEST_CASE("LLaMA with GQA and an lm_head matches transformers in float64", "[llama][golden]") {
  check_golden("gqa_untied");
}

TEST_CASE("LLaMA with tied embeddings matches transformers in float64", "[llama][golden]") {
  check_golden("tied_mha");
}

TEST_CASE("LLaMA with Llama-3 rope scaling matches transformers in float64", "[llama][golden]") {
  check_golden("llama3_rope");
}
