// Language-model datasets from options: a plain-text corpus packed for causal-LM training (kind text) or
// instruction / chat JSONL (kind chat), with their validation side. The trainer's `data.dataset: text | chat`
// keys fill TextDataOptions (train/trainer_config.h, docs/config.md); the LM trainer calls
// make_text_datasets() and batches both sides with TextLoader (text_loader.h).
//
//   auto tok = data::load_tokenizer(cfg.data.text.tokenizer);
//   data::TextDatasets ds = data::make_text_datasets(cfg.data.text, *tok, cfg.run.seed);
//   ds.train->check_vocab(model_vocab, "model.vocab_size");
//   data::TextLoader loader(ds.train, {.batch_size = cfg.data.batch_size, .seed = cfg.run.seed});
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/data/text_chat.h"
#include "hadatrain/data/text_dataset.h"
#include "hadatrain/data/tokenizer.h"

namespace ht::data {

enum class TextKind : uint8_t {
  text,  // plain-text files, one document each, packed into windows (PackedTextDataset)
  chat,  // JSONL conversations / instructions, loss on responses (ChatDataset)
};

struct TextDataOptions {
  TextKind kind = TextKind::text;
  std::vector<std::string> paths;      // files, folders or glob patterns (list_text_files)
  std::vector<std::string> val_paths;  // separate validation sources; when empty, val_fraction of `paths`
  double val_fraction = 0.05;          // documents (text) or rows (chat) held out, chosen by the seed
  std::string tokenizer;               // a tokenizer file or folder (load_tokenizer); read by the caller
  int64_t seq_len = 512;               // tokens per row
  std::string cache_dir;               // token cache folder; "" = default_token_cache_dir()
  std::vector<std::string> extensions;  // files taken from folders; empty: ".txt" (text), ".jsonl" (chat)
  ChatLayout layout = ChatLayout::pad;  // chat: one example per row, or packed
  std::string chat_format;              // chat: "llama3" | "llama2"; "" = default_chat_format(tokenizer)
  int num_threads = 0;                  // tokenisation threads; 0: one per hardware thread (at most 16)
};

struct TextDatasets {
  std::shared_ptr<const TextDataset> train;
  std::shared_ptr<const TextDataset> val;  // null when val_fraction is 0 and there are no val_paths
};

// The rows `rows` (in that order) of `base`.
class TextSubset final : public TextDataset {
 public:
  TextSubset(std::shared_ptr<const TextDataset> base, std::vector<int64_t> rows);
  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }
  int64_t seq_len() const override { return base_->seq_len(); }
  void get(int64_t i, int64_t* input_ids, int64_t* labels) const override;
  std::string describe(int64_t i) const override;
  void check_vocab(int64_t vocab_size, const std::string& whose) const override { base_->check_vocab(vocab_size, whose); }
  uint64_t digest() const override;  // the base's and the rows taken

 private:
  std::shared_ptr<const TextDataset> base_;
  std::vector<int64_t> rows_;
};

// Builds the training and validation datasets of `opts` with `tok` (text: through the token cache; chat:
// tokenising the JSONL). The validation split is split_documents(.., opts.val_fraction, seed) over the
// corpus's documents (text) or rows (chat: a packed window that straddles two examples lands on one side).
TextDatasets make_text_datasets(const TextDataOptions& opts, const Tokenizer& tok, uint64_t seed);

}  // namespace ht::data
