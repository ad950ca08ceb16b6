// Chat templates: a conversation (role, content messages) -> token ids, with a per-token flag saying
// whether the token is part of an assistant response, so that fine-tuning can put the loss on responses
// only. Two formats:
//
//   llama3: <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ... per message
//           (CONTENT trimmed of surrounding whitespace, as the Llama-3 tokenizer_config.json template does).
//           Response tokens: an assistant message's CONTENT and its <|eot_id|>.
//   llama2: [<s>][INST] USER [/INST] ANSWER </s> per (user, assistant) pair, a system message folded into
//           the first user turn as "<<SYS>>\nSYSTEM\n<</SYS>>\n\n" (Meta's chat format). Response tokens:
//           ANSWER and its </s>.
//
// The ids equal those of tokenising the rendered text in one piece with special tokens parsed (what
// transformers' apply_chat_template(..., tokenize=True) gives); tests check this on both real tokenizers.
//
//   auto tok = data::load_tokenizer(dir);
//   std::vector<data::ChatMessage> chat{{"user", "Hi"}, {"assistant", "Hello!"}};
//   data::ChatTokens t = data::apply_chat_template(*tok, chat, {.format = data::default_chat_format(*tok)});
//   // t.ids.size() == t.is_response.size(); loss where t.is_response[i] != 0
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hadatrain/data/tokenizer.h"

namespace ht::data {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant" (llama3 also accepts any other role, e.g. "ipython")
  std::string content;
};

enum class ChatFormat { llama3, llama2 };

// "llama3" / "llama2"; anything else throws ht::Error listing the accepted names.
ChatFormat parse_chat_format(std::string_view name);
std::string_view chat_format_name(ChatFormat format);

// llama3 when the tokenizer has <|start_header_id|> and <|eot_id|>, else llama2.
ChatFormat default_chat_format(const Tokenizer& tok);

struct ChatTemplateOptions {
  ChatFormat format = ChatFormat::llama3;
  // Start with BOS (<|begin_of_text|> or <s>). llama2 also puts BOS before every later [INST] turn.
  bool add_bos = true;
  // End with the opening of an assistant turn for generation (llama3: the assistant header; llama2: the
  // conversation must then end with a user message, whose "[INST] ... [/INST]" is the prompt).
  bool add_generation_prompt = false;
};

struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> is_response;  // 1 for tokens of an assistant response (loss), 0 otherwise; same size
};

// The tokens that end an assistant turn, where generation in a conversation stops: llama3's <|eot_id|>, llama2's
// EOS (</s>). Throws ht::Error when the tokenizer lacks it, as apply_chat_template does.
std::vector<int32_t> chat_stop_ids(const Tokenizer& tok, ChatFormat format);

// Throws ht::Error naming the message index when the conversation does not fit the format (llama2: an
// optional system message, then user/assistant alternating starting with user) or the tokenizer lacks a
// special token the format needs.
ChatTokens apply_chat_template(const Tokenizer& tok, std::span<const ChatMessage> messages,
                               const ChatTemplateOptions& options);

}  // namespace ht::data
