// Loads a language model and generates text, the way a program that embeds hadatrain would.
//
//   generate CHECKPOINT "PROMPT" [TOKENIZER]   CHECKPOINT: an HF folder or a checkpoint (root) of an LM run
//   generate                                   a tiny random Llama written as an HF folder first, with the
//                                              character-level tokenizer of tests/fixtures (what CTest runs)
//
// Without arguments it also checks itself: the model read back from the folder generates exactly what the
// model that wrote it does, and the same seed draws the same tokens twice; it exits 1 when not.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <string>
#include <vector>

#include "hadatrain/core/error.h"
#include "hadatrain/data/tokenizer.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/models/llama_generate.h"
#include "hadatrain/train/lm_source.h"

namespace fs = std::filesystem;
using namespace ht;

namespace {

std::vector<int64_t> generate_text(models::Llama& model, const data::Tokenizer& tok, const std::string& prompt,
                                   const models::SamplingOptions& sampling, int64_t new_tokens) {
  std::vector<int64_t> ids;
  if (tok.bos_id()) ids.push_back(*tok.bos_id());
  for (int32_t id : tok.encode(prompt)) ids.push_back(id);
  models::GenerateOptions o;
  o.max_new_tokens = new_tokens;
  o.sampling = sampling;
  const models::GenerateResult r = models::generate(model, ids, o);
  std::vector<int32_t> out(r.tokens.begin(), r.tokens.end());
  std::printf("%s%s\n", prompt.c_str(), tok.decode(out).c_str());
  return r.tokens;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc >= 3) {
    const train::LlamaSource src = train::find_llama_source(argv[1]);
    const std::string tok_path = argc >= 4 ? argv[3] : src.tokenizer.string();
    // A tokenizer with more ids than the model is refused; with fewer, only its ids are drawn (the model's
    // embedding may be padded past them: Note [Tokenizer and model vocabularies] in train/lm_source.h).
    const auto tok = train::load_tokenizer_for(tok_path, src.config.vocab_size,
                                               {.what = "tokenizer", .model = src.dir.string()});
    auto model = train::load_llama_source(src);
    generate_text(*model, *tok, argv[2],
                  {.temperature = 0.8, .top_p = 0.95, .seed = 0, .vocab_limit = tok->vocab_size()}, 64);
    return 0;
  }
  // A tiny Llama for the character tokenizer (80 pieces), written as an HF folder and read back.
  const auto tok = data::load_tokenizer("tests/fixtures/lm_char.model");
  models::LlamaConfig c = models::LlamaConfig::tiny();
  c.vocab_size = tok->vocab_size();
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  Generator gen(7);
  models::Llama written(c, {.init = models::LlamaInit::normal, .gen = &gen});
  const fs::path dir = fs::temp_directory_path() / ("hadatrain_example_generate_" + std::to_string(::getpid()));
  models::save_hf_checkpoint(dir, written, {.dtype = DType::f32});
  auto read = models::load_hf_llama(dir, {});
  fs::remove_all(dir);

  const std::vector<int64_t> a = generate_text(written, *tok, "Call me", {}, 16);  // greedy
  const std::vector<int64_t> b = generate_text(*read, *tok, "Call me", {}, 16);
  const models::SamplingOptions s{.temperature = 1.0, .top_p = 0.9, .seed = 42};
  const std::vector<int64_t> c1 = generate_text(*read, *tok, "Call me", s, 16);
  const std::vector<int64_t> c2 = generate_text(*read, *tok, "Call me", s, 16);
  if (a != b || c1 != c2 || a.empty()) {
    std::fprintf(stderr, "generate: %s\n",
                 a != b ? "the model read back generates other tokens than the model that wrote it"
                 : a.empty() ? "no token was generated"
                             : "the same seed drew different tokens");
    return 1;
  }
  std::printf("ok: the HF folder round trip and the seeded draws are reproducible\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
