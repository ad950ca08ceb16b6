// `hadatrain generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-p P]
// [--seed S] [--tokenizer PATH] [--device D] [--precision P]`: text from a language model, streamed to stdout.
// DIR is an HF folder or a checkpoint of a language-model run (train/lm_source.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/data/tokenizer.h"
#include "hadatrain/models/llama_generate.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/train/lm_source.h"

namespace ht::cli {
namespace {

struct GenerateArgs {
  std::string checkpoint, prompt, tokenizer, device = "cpu", precision = "fp32", log_level = "warn";
  int64_t max_new_tokens = 128;
  double temperature = 0.8, top_p = 0.95;
  uint64_t seed = 0;
  bool no_bos = false;
};

const char* reason_text(models::StopReason r) {
  switch (r) {
    case models::StopReason::stop_token: return "end of text";
    case models::StopReason::max_new_tokens: return "--max-new-tokens reached";
    case models::StopReason::context_full: return "the model's context is full";
    case models::StopReason::callback: return "stopped";
  }
  return "?";
}

int run_generate(const GenerateArgs& a) {
  ht::logging::set_level(a.log_level);
  const train::LlamaSource src = train::find_llama_source(a.checkpoint);
  const std::string tok_path = !a.tokenizer.empty() ? a.tokenizer : src.tokenizer.string();
  HT_CHECK(!tok_path.empty(), "{} does not say which tokenizer it was trained with: give --tokenizer PATH",
           src.dir.string());
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(tok_path);
  const Device device = parse_device(a.device);
  if (device.is_cuda()) require_cuda("hadatrain generate --device cuda");
  std::shared_ptr<models::Llama> model = train::load_llama_source(src, device);
  if (a.precision == "bf16") model->compute_dtype = DType::bf16;

  std::vector<int64_t> prompt;
  if (!a.no_bos && tok->bos_id()) prompt.push_back(*tok->bos_id());
  for (int32_t id : tok->encode(a.prompt)) prompt.push_back(id);
  HT_CHECK(!prompt.empty(), "--prompt is empty and the tokenizer has no BOS token to start from");

  models::GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.sampling = {.temperature = a.temperature, .top_p = a.top_p, .seed = a.seed};
  if (const auto eos = tok->eos_id()) o.stop_ids.push_back(*eos);
  for (int64_t id : model->config.eos_token_ids)
    if (id < model->config.vocab_size) o.stop_ids.push_back(id);

  // Streaming: the prompt's ids and the new ones decoded together, and what was not printed yet printed (a token
  // alone may be part of a multi-byte character, and SentencePiece drops the space of a text's first piece).
  std::vector<int32_t> ids;
  for (std::size_t i = a.no_bos || !tok->bos_id() ? 0 : 1; i < prompt.size(); ++i) ids.push_back(static_cast<int32_t>(prompt[i]));
  const std::string start = tok->decode(ids);
  fmt::print("{}", start);
  std::fflush(stdout);
  std::size_t shown = start.size();
  const std::vector<int64_t> stops = o.stop_ids;
  const auto result = models::generate(*model, prompt, o, [&](int64_t t) {
    if (std::find(stops.begin(), stops.end(), t) != stops.end()) return true;
    ids.push_back(static_cast<int32_t>(t));
    const std::string text = tok->decode(ids);
    if (text.size() > shown) {
      fmt::print("{}", text.substr(shown));
      std::fflush(stdout);
      shown = text.size();
    }
    return true;
  });
  fmt::print("\n");
  fmt::print(stderr, "[{} new tokens, {}]\n", result.tokens.size(), reason_text(result.reason));
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  Command c;
  c.app = app.add_subcommand("generate", "Generate text with a language model (an HF folder or an LM run's checkpoint)");
  c.app->add_option("--checkpoint", a->checkpoint,
                    "An HF model folder, a step_<N> checkpoint of a language-model run, or its checkpoint root")
      ->required();
  c.app->add_option("--prompt", a->prompt, "The text to continue")->required();
  c.app->add_option("--max-new-tokens", a->max_new_tokens, "Tokens to generate at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c.app->add_option("--temperature", a->temperature, "0: greedy; above 0: sample from softmax(logits / T)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c.app->add_option("--top-p", a->top_p, "Nucleus sampling: the most likely tokens up to this probability")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {  // (0, 1]: sampling from no token at all is not a choice
            char* end = nullptr;
            const double p = std::strtod(v.c_str(), &end);
            return !v.empty() && *end == '\0' && p > 0.0 && p <= 1.0 ? "" : "must be a number in (0, 1], got " + v;
          },
          "in (0, 1]"))
      ->capture_default_str();
  c.app->add_option("--seed", a->seed, "Seed of the sampling draws (same seed, same text)")->capture_default_str();
  c.app->add_option("--tokenizer", a->tokenizer,
                    "Tokenizer file or folder (default: the HF folder's, or the one the run was trained with)");
  c.app->add_option("--device", a->device, "cpu, cuda or cuda:N")->capture_default_str();
  c.app->add_option("--precision", a->precision, "fp32 or bf16 compute")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  c.app->add_flag("--no-bos", a->no_bos, "Do not put the tokenizer's BOS token before the prompt");
  c.app->add_option("--log-level", a->log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
  c.run = [a] { return run_generate(*a); };
  return c;
}

}  // namespace ht::cli
