// `hadatrain generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-p P]
// [--seed S] [--tokenizer PATH] [--device D] [--precision P] [--chat [--system TEXT] [--chat-format F]]`: text from a
// language model, streamed to stdout. DIR is an HF folder, a checkpoint of a language-model run or a PEFT adapter
// folder on its base (train/lm_source.h). With --chat the prompt is a user's message in the chat template and the
// reply alone is printed.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "commands.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/data/chat_template.h"
#include "hadatrain/data/tokenizer.h"
#include "hadatrain/models/llama_generate.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/train/lm_source.h"

namespace ht::cli {
namespace {

struct GenerateArgs {
  std::string checkpoint, prompt, tokenizer, device = "cpu", precision = "fp32", log_level = "warn";
  bool chat = false;
  std::string system, chat_format;  // --system, --chat-format ("" = the checkpoint's, else the tokenizer's)
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
  const bool flag = !a.tokenizer.empty();
  const train::RecordedTokenizer rec = train::recorded_tokenizer(src);
  const std::string tok_path = flag ? a.tokenizer : rec.path.string();
  HT_CHECK(!tok_path.empty() || src.kind == train::LlamaSource::Kind::hf,
           "{} does not say which tokenizer it was trained with: give --tokenizer PATH", src.dir.string());
  HT_CHECK(!tok_path.empty(), "the HF folder {} holds no tokenizer (tokenizer.json or tokenizer.model): give "
           "--tokenizer PATH", src.dir.string());
  const std::string recorded = rec.what + " (give --tokenizer PATH for another)";
  const int64_t V = src.config.vocab_size;
  const std::unique_ptr<data::Tokenizer> tok =
      train::load_tokenizer_for(tok_path, V, {.what = flag ? "--tokenizer" : recorded, .model = src.dir.string()});
  const Device device = parse_device(a.device);
  if (device.is_cuda()) require_cuda("hadatrain generate --device cuda");

  std::vector<int64_t> prompt;
  std::vector<int64_t> chat_stops;  // --chat: the tokens that end the reply's turn
  if (a.chat) {
    // The chat template: --chat-format, else the template a chat run's checkpoint records (its rows were
    // made with it), else the tokenizer's (llama3 when it has Llama-3's header and end-of-turn tokens), as the
    // trainer chooses for data.chat_format: auto.
    std::string why = "--chat-format";
    std::string name = a.chat_format;
    if (name.empty() && !src.chat_format.empty()) {
      name = src.chat_format;
      why = fmt::format("the chat template {} records", (src.dir / "model.safetensors").string());
    } else if (name.empty()) {
      name = data::chat_format_name(data::default_chat_format(*tok));
      why = "the tokenizer's";
    }
    const data::ChatFormat format = data::parse_chat_format(name);
    HT_CHECK(format != data::ChatFormat::llama3 || data::default_chat_format(*tok) == data::ChatFormat::llama3,
             "--chat: the chat template is llama3 ({}), but the tokenizer {} has no <|start_header_id|> or no "
             "<|eot_id|> token; give --chat-format llama2 or the model's own tokenizer",
             why, tok_path);
    std::vector<data::ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", a.prompt});
    const data::ChatTokens t = data::apply_chat_template(
        *tok, messages, {.format = format, .add_bos = !a.no_bos, .add_generation_prompt = true});
    prompt.assign(t.ids.begin(), t.ids.end());
    for (int32_t id : data::chat_stop_ids(*tok, format)) chat_stops.push_back(id);
    spdlog::info("--chat: the {} chat template ({}), {} prompt tokens", name, why, prompt.size());
  } else {
    if (!a.no_bos && tok->bos_id()) prompt.push_back(*tok->bos_id());
    for (int32_t id : tok->encode(a.prompt)) prompt.push_back(id);
  }
  HT_CHECK(!prompt.empty(), "--prompt is empty and {}: the model needs at least one token to continue; give a prompt{}",
           a.no_bos ? "--no-bos leaves out the BOS token" : "the tokenizer has no BOS token to start from",
           a.no_bos ? " or drop --no-bos" : "");

  models::GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  // Note [Tokenizer and model vocabularies]: embedding rows past the tokenizer's ids are never drawn.
  o.sampling = {.temperature = a.temperature, .top_p = a.top_p, .seed = a.seed, .vocab_limit = tok->vocab_size()};
  if (const auto eos = tok->eos_id()) o.stop_ids.push_back(*eos);
  for (int64_t id : src.config.eos_token_ids)
    if (id < tok->vocab_size()) o.stop_ids.push_back(id);
  for (int64_t id : chat_stops)
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) == o.stop_ids.end()) o.stop_ids.push_back(id);
  // Everything that can fail is checked before anything is printed.
  const int64_t positions = src.config.max_position_embeddings;
  HT_CHECK(static_cast<int64_t>(prompt.size()) <= positions, "--prompt is {} tokens long{}, more than the {} "
           "positions of the model {} (max_position_embeddings): shorten it", prompt.size(),
           a.chat ? " in the chat template" : a.no_bos || !tok->bos_id() ? "" : " with BOS", positions,
           src.dir.string());
  models::check_generate_inputs(src.config, prompt, o);
  // On stderr, as the closing count: stdout holds the text alone.
  if (tok->vocab_size() < V)
    fmt::print(stderr, "note: the model {} has {} embedding rows, its tokenizer {} has {} ids: ids {} to {} are never "
               "drawn (padding of the embedding; if the tokenizer is not the model's, the text is garbage)\n",
               src.dir.string(), V, tok_path, tok->vocab_size(), tok->vocab_size(), V - 1);

  std::shared_ptr<models::Llama> model = train::load_llama_source(src, device);
  if (a.precision == "bf16") model->compute_dtype = DType::bf16;

  // Streaming: the prompt's ids and the new ones decoded together, and what was not printed yet printed (a token
  // alone may be part of a multi-byte character, and SentencePiece drops the space of a text's first piece). A
  // decode that ends inside a character ends in U+FFFD until its last byte comes: that tail waits
  // (data::settled_length), so what is printed stays a prefix of the final text.
  // With --chat the reply alone is printed: the prompt is the template's markup around the user's message.
  std::vector<int32_t> ids;
  if (!a.chat)
    for (std::size_t i = a.no_bos || !tok->bos_id() ? 0 : 1; i < prompt.size(); ++i)
      ids.push_back(static_cast<int32_t>(prompt[i]));
  const std::string start = tok->decode(ids);
  fmt::print("{}", start);
  std::fflush(stdout);
  std::size_t shown = start.size();
  const std::vector<int64_t> stops = o.stop_ids;
  const auto result = models::generate(*model, prompt, o, [&](int64_t t) {
    if (std::find(stops.begin(), stops.end(), t) != stops.end()) return true;
    ids.push_back(static_cast<int32_t>(t));
    const std::string text = tok->decode(ids);
    if (const std::size_t end = data::settled_length(text); end > shown) {
      fmt::print("{}", text.substr(shown, end - shown));
      std::fflush(stdout);
      shown = end;
    }
    return true;
  });
  if (const std::string text = tok->decode(ids); text.size() > shown) fmt::print("{}", text.substr(shown));
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
  // CLI11 takes the argument after --prompt as its value even when it is one of this command's options, so
  // `--prompt --no-bos` would continue the text "--no-bos" and `--prompt --max-new-tokens 3` report a stray "3".
  CLI::App* sub = c.app;
  c.app->add_option("--prompt", a->prompt, "The text to continue")
      ->required()
      ->check(CLI::Validator(
          [sub](std::string& v) -> std::string {
            const std::string name = v.substr(0, v.find('='));
            if (name.size() < 2 || name[0] != '-' || sub->get_option_no_throw(name) == nullptr) return "";
            return fmt::format("got {}, which is one of generate's options: put the prompt's text right after "
                               "--prompt (quoted when it has spaces)",
                               v);
          },
          "TEXT"));
  c.app->add_option("--max-new-tokens", a->max_new_tokens, "Tokens to generate at most")
      ->check(integer_check(1, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  c.app->add_option("--temperature", a->temperature, "0: greedy; above 0: sample from softmax(logits / T)")
      ->check(number_check("a finite number >= 0", [](double t) { return t >= 0.0; }))
      ->capture_default_str();
  // (0, 1]: sampling from no token at all is not a choice
  c.app->add_option("--top-p", a->top_p, "Nucleus sampling: the most likely tokens up to this probability")
      ->check(number_check("a number in (0, 1]", [](double p) { return p > 0.0 && p <= 1.0; }))
      ->capture_default_str();
  c.app->add_option("--seed", a->seed, "Seed of the sampling draws (same seed, same text)")
      ->check(unsigned_check())
      ->capture_default_str();
  c.app->add_option("--tokenizer", a->tokenizer,
                    "Tokenizer file or folder (default: the HF folder's, or the one the run was trained with)");
  c.app->add_option("--device", a->device, "cpu, cuda or cuda:N")->capture_default_str();
  c.app->add_option("--precision", a->precision, "The compute dtype")
      ->transform(spelling_check({"fp32", "bf16"}, float_spellings()))
      ->capture_default_str();
  c.app->add_flag("--no-bos", a->no_bos, "Do not put the tokenizer's BOS token before the prompt");
  CLI::Option* chat = c.app->add_flag(
      "--chat", a->chat,
      "The prompt is a user's message: put it in the chat template (the one the run trained with, else the "
      "tokenizer's), stop at the end of the reply's turn, print the reply alone");
  c.app->add_option("--system", a->system, "--chat: a system message before the user's")->needs(chat);
  c.app->add_option("--chat-format", a->chat_format, "--chat: the chat template, llama3 or llama2")
      ->check(CLI::IsMember({"llama3", "llama2"}))
      ->needs(chat);
  c.app->add_option("--log-level", a->log_level, "trace, debug, info, warn, error or off")
      ->check(log_level_check())
      ->capture_default_str();
  c.run = [a] { return run_generate(*a); };
  return c;
}

}  // namespace ht::cli
