// Instruction / chat fine-tuning data: JSONL files whose lines are conversations, tokenised through a chat
// template (chat_template.h) with the loss on assistant responses only.
//
// Each non-blank line is one example, either
//   {"messages": [{"role": "system", "content": "..."}, {"role": "user", ...}, {"role": "assistant", ...}]}
// or the instruction form (Alpaca)
//   {"instruction": "...", "input": "...", "output": "..."}   ("input" optional; user = instruction, then a
//                                                              blank line and input when non-empty;
//                                                              assistant = output)
// A line that is not one of these is an ht::Error naming the file and the line number.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hadatrain/data/chat_template.h"
#include "hadatrain/data/text_dataset.h"

namespace ht::data {

enum class ChatLayout : uint8_t {
  pad,   // one example per row: truncated to seq_len + 1 tokens, padded after its end (labels -100 there)
  pack,  // examples concatenated and cut into windows like PackedTextDataset (no padding)
};

struct ChatDataOptions {
  int64_t seq_len = 512;
  ChatLayout layout = ChatLayout::pad;
  std::optional<ChatFormat> format;  // unset: default_chat_format(tokenizer)
  int num_threads = 0;               // tokenisation threads; 0: one per hardware thread (at most 16)
};

// The messages of one JSONL line; `where` ("file:line") starts every error message.
std::vector<ChatMessage> parse_chat_line(std::string_view line, const std::string& where);

// The pad id of `tok`: its "<pad>" token when it has one, else EOS, else 0. Padded positions carry no loss.
int32_t pad_id(const Tokenizer& tok);

class ChatDataset final : public TextDataset {
 public:
  // Reads and tokenises every example of `files` (in order). Rows whose labels would all be kIgnoreIndex are left
  // out, with a warning that counts them: pad, an example whose response lies beyond seq_len; pack, a window that
  // lies inside prompts (it would add nothing to the loss, and a batch, a rank's rows or a micro-batch of such
  // windows alone would have a loss that is a mean over nothing).
  ChatDataset(const std::vector<std::filesystem::path>& files, const Tokenizer& tok, ChatDataOptions opts);

  int64_t size() const override { return rows_; }
  int64_t seq_len() const override { return opts_.seq_len; }
  void get(int64_t i, int64_t* input_ids, int64_t* labels) const override;
  std::string describe(int64_t i) const override;
  void check_vocab(int64_t vocab_size, const std::string& whose) const override;
  uint64_t digest() const override;  // of every example's ids and response flags and the rows' layout

  int64_t num_examples() const { return static_cast<int64_t>(where_.size()); }
  int64_t num_truncated() const { return truncated_; }
  int32_t pad() const { return pad_; }

 private:
  std::size_t example_at(int64_t stream_pos) const;
  ChatDataOptions opts_;
  std::vector<int32_t> ids_;           // every example's ids, concatenated
  std::vector<uint8_t> response_;      // is_response of each id
  std::vector<int64_t> starts_;        // example e is [starts_[e], starts_[e+1])
  std::vector<std::string> where_;     // "file:line" of each example
  std::vector<int64_t> row_example_;   // pad layout: the example of each row
  std::vector<int64_t> row_window_;    // pack layout: the window of each row (row i reads the stream from window*T)
  int64_t rows_ = 0;
  int64_t truncated_ = 0;
  int32_t pad_ = 0;
};

}  // namespace ht::data
