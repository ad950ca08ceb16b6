// Tokenizers for language models: text <-> token ids. Two engines implement this interface:
// SentencePiece models (`tokenizer.model`, Llama 1/2) through libsentencepiece, and Hugging Face
// `tokenizer.json` byte-level BPE (Llama 3) with its pre-tokenisation regex through PCRE2.
//
//   auto tok = data::load_tokenizer("~/.cache/hadatrain/lm/llama3");   // a file or a model folder
//   std::vector<int32_t> ids = tok->encode("Hello world");              // no BOS/EOS added
//   std::string text = tok->decode(ids);
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ht::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "sentencepiece" or "bpe".
  virtual std::string kind() const = 0;
  // Token ids of `text`, without BOS/EOS. Special-token strings in `text` ("<|eot_id|>") are encoded as
  // those special ids only when `parse_special` is set (chat templates); otherwise as plain text.
  // Thread-safe. BPE: `text` must be valid UTF-8 (else ht::Error naming the byte offset).
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = false) const = 0;
  // The text of `ids`. Ids outside [0, vocab_size()) throw ht::Error naming the id and the vocabulary size.
  // decode(encode(x)) == x for valid UTF-8 x. BPE: the tokens' bytes concatenated, special tokens as their
  // text, no clean-up of spaces (ids cut inside a multi-byte character give incomplete UTF-8).
  // SentencePiece: as libsentencepiece decodes (the dummy-prefix space of the first piece dropped, control
  // tokens such as <s> and </s> decode to nothing).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // The id of a piece or special token ("<|eot_id|>", "<s>"), if the vocabulary has it.
  virtual std::optional<int32_t> token_to_id(std::string_view piece) const = 0;
  // A digest of the files that define this tokenizer: a token cache made with another fingerprint is stale.
  virtual std::string fingerprint() const = 0;
};

// Loads `path`: a SentencePiece `.model` file, a `tokenizer.json`, or a folder holding either (a folder with
// both prefers tokenizer.json, as transformers' fast tokenizers do). Throws ht::Error naming the path and
// what was expected when nothing usable is there or a file does not parse.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

// For streaming a decode: the length of `text` without its trailing U+FFFD replacement characters. Decoding ids
// that end inside a multi-byte character (SentencePiece byte-fallback pieces, one byte each) gives U+FFFD for the
// bytes so far, which the next ids may turn into the character: print text[0, settled_length) now and the rest
// once it settles (or at the end).
std::size_t settled_length(std::string_view text);

// Whether this build has the engine of `kind` ("sentencepiece": libsentencepiece; "bpe": PCRE2). Both are
// optional at build time; without one, loading its files throws an error that says so.
bool tokenizer_engine_built(std::string_view kind);

}  // namespace ht::data
