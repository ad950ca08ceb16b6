// Chat templates (include/hadatrain/data/chat_template.h): the conversation is laid out as a list of
// segments (a special token, or a stretch of text), each flagged response or not, and each text segment
// is encoded on its own. Segment boundaries sit where the tokenizers cannot merge across them (a special
// token; "\n\n" before text that starts with no whitespace, which the Llama-3 regex splits off; a
// SentencePiece word start), so the ids equal those of encoding the whole rendered text, while every
// token keeps the flag of the segment it came from.
#include "hadatrain/data/chat_template.h"

#include "hadatrain/core/error.h"

namespace ht::data {
namespace {

struct Segment {
  std::string text;           // the text to encode, when id is unset
  std::optional<int32_t> id;  // a special token
  bool response = false;
};

Segment text(std::string s, bool response = false) { return Segment{std::move(s), std::nullopt, response}; }
Segment special(int32_t id, bool response = false) { return Segment{std::string(), id, response}; }

std::string trim(std::string_view s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

int32_t special_id(const Tokenizer& tok, const char* piece, ChatFormat format) {
  const auto id = tok.token_to_id(piece);
  HT_CHECK(id.has_value(), "chat template {}: the tokenizer ({}) has no {} token", chat_format_name(format),
           tok.kind(), piece);
  return *id;
}

std::vector<Segment> llama3_segments(const Tokenizer& tok, std::span<const ChatMessage> messages,
                                     const ChatTemplateOptions& o) {
  const int32_t start = special_id(tok, "<|start_header_id|>", o.format);
  const int32_t end = special_id(tok, "<|end_header_id|>", o.format);
  const int32_t eot = special_id(tok, "<|eot_id|>", o.format);
  std::vector<Segment> seg;
  if (o.add_bos) seg.push_back(special(special_id(tok, "<|begin_of_text|>", o.format)));
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    HT_CHECK(!trim(m.role).empty(), "chat template llama3: message {} has an empty role", i);
    const bool response = m.role == "assistant";
    seg.push_back(special(start));
    seg.push_back(text(m.role));
    seg.push_back(special(end));
    seg.push_back(text("\n\n"));
    seg.push_back(text(trim(m.content), response));
    seg.push_back(special(eot, response));
  }
  if (o.add_generation_prompt) {
    seg.push_back(special(start));
    seg.push_back(text("assistant"));
    seg.push_back(special(end));
    seg.push_back(text("\n\n"));
  }
  return seg;
}

// Meta's Llama-2 chat layout: per (user, assistant) pair "<s>[INST] USER [/INST] ANSWER </s>", the system
// prompt folded into the first user message.
std::vector<Segment> llama2_segments(const Tokenizer& tok, std::span<const ChatMessage> messages,
                                     const ChatTemplateOptions& o) {
  const auto bos = tok.bos_id(), eos = tok.eos_id();
  HT_CHECK(bos && eos, "chat template llama2: the tokenizer ({}) has no BOS or no EOS token", tok.kind());
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = "<<SYS>>\n" + trim(messages[0].content) + "\n<</SYS>>\n\n";
    first = 1;
  }
  std::vector<Segment> seg;
  for (size_t i = first; i < messages.size(); i += 2) {
    HT_CHECK(messages[i].role == "user", "chat template llama2: message {} has role '{}', expected 'user' (an "
             "optional system message, then user and assistant alternating)", i, messages[i].role);
    if (o.add_bos || i > first) seg.push_back(special(*bos));
    seg.push_back(text("[INST] " + (i == first ? system : std::string()) + trim(messages[i].content) + " [/INST]"));
    if (i + 1 < messages.size()) {
      HT_CHECK(messages[i + 1].role == "assistant", "chat template llama2: message {} has role '{}', expected "
               "'assistant' (user and assistant alternate)", i + 1, messages[i + 1].role);
      // The space between [/INST] and the answer is the answer's SentencePiece word-start "▁".
      seg.push_back(text(trim(messages[i + 1].content) + " ", true));
      seg.push_back(special(*eos, true));
    }
  }
  HT_CHECK(first < messages.size(), "chat template llama2: the conversation has no user message");
  if (o.add_generation_prompt)
    HT_CHECK(messages.back().role == "user", "chat template llama2: add_generation_prompt needs a conversation "
             "that ends with a user message; message {} has role '{}'", messages.size() - 1, messages.back().role);
  return seg;
}

}  // namespace

ChatFormat parse_chat_format(std::string_view name) {
  if (name == "llama3") return ChatFormat::llama3;
  if (name == "llama2") return ChatFormat::llama2;
  HT_FAIL("unknown chat format '{}' (expected llama3 or llama2)", name);
}

std::string_view chat_format_name(ChatFormat format) {
  return format == ChatFormat::llama3 ? "llama3" : "llama2";
}

ChatFormat default_chat_format(const Tokenizer& tok) {
  return tok.token_to_id("<|start_header_id|>") && tok.token_to_id("<|eot_id|>") ? ChatFormat::llama3
                                                                                 : ChatFormat::llama2;
}

std::vector<int32_t> chat_stop_ids(const Tokenizer& tok, ChatFormat format) {
  if (format == ChatFormat::llama3) return {special_id(tok, "<|eot_id|>", format)};
  const auto eos = tok.eos_id();
  HT_CHECK(eos.has_value(), "chat template llama2: the tokenizer ({}) has no EOS token", tok.kind());
  return {*eos};
}

ChatTokens apply_chat_template(const Tokenizer& tok, std::span<const ChatMessage> messages,
                               const ChatTemplateOptions& options) {
  HT_CHECK(!messages.empty(), "chat template {}: the conversation has no messages", chat_format_name(options.format));
  const std::vector<Segment> segments = options.format == ChatFormat::llama3
                                            ? llama3_segments(tok, messages, options)
                                            : llama2_segments(tok, messages, options);
  ChatTokens out;
  for (const Segment& s : segments) {
    if (s.id) {
      out.ids.push_back(*s.id);
    } else {
      const std::vector<int32_t> ids = tok.encode(s.text);
      out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    }
    out.is_response.resize(out.ids.size(), s.response ? 1 : 0);
  }
  return out;
}

}  // namespace ht::data
