// The tokenizer engines behind data::load_tokenizer (src/data/tokenizer.cpp) and the helpers they share.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "hadatrain/core/error.h"
#include "hadatrain/data/tokenizer.h"

namespace ht::data::detail {

// Thrown by an engine for a file it reads correctly but cannot serve (a tokenizer.json whose model or
// pre-tokenizer it does not implement, or an engine left out of this build). load_tokenizer catches it to
// fall back to a folder's tokenizer.model; every other ht::Error (a file that does not parse) propagates.
class UnsupportedTokenizer : public ht::Error {
 public:
  using ht::Error::Error;
};

// The bytes of `path`; throws ht::Error naming the path when it cannot be read.
std::string read_file_bytes(const std::filesystem::path& path);

// 64-bit FNV-1a of `bytes`, as 16 hex digits (for fingerprints: cheap, stable across builds and machines).
std::string fnv1a_hex(std::string_view bytes);

// SentencePiece model (tokenizer.model). Throws UnsupportedTokenizer when built without libsentencepiece.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model_file);

// Hugging Face tokenizer.json with a byte-level BPE model. `config_file` (tokenizer_config.json, may be
// empty or absent) supplies the BOS and EOS tokens. Throws UnsupportedTokenizer for other model types and
// when built without PCRE2.
std::unique_ptr<Tokenizer> load_bpe(const std::filesystem::path& json_file,
                                    const std::filesystem::path& config_file);

}  // namespace ht::data::detail
