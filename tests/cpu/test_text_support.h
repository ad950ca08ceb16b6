// Shared by the text-data tests: a byte-level Tokenizer (id = byte value, plus the Llama-3 special tokens so
// the llama3 chat template works), and a scratch folder per test program.
#pragma once
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

#include "hadatrain/core/error.h"
#include "hadatrain/data/tokenizer.h"

namespace text_test {

struct ByteTokenizerOptions {
  bool bos = true;  // <|begin_of_text|> (256) as BOS
  bool eos = true;  // <|end_of_text|> (257) as EOS
  int64_t vocab_size = 261;
  std::string fingerprint = "bytes-v1";
  int32_t bad_id_for = -1;  // encode() emits vocab_size for this byte (a broken tokenizer)
  std::string throw_on;     // encode() throws ht::Error when the text contains this string
};

// Bytes 0..255 are ids 0..255; 256 <|begin_of_text|>, 257 <|end_of_text|>, 258 <|start_header_id|>,
// 259 <|end_header_id|>, 260 <|eot_id|> (parsed in text only with parse_special).
class ByteTokenizer final : public ht::data::Tokenizer {
 public:
  explicit ByteTokenizer(ByteTokenizerOptions o = {}) : o_(std::move(o)) {}
  std::string kind() const override { return "bytes"; }
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override {
    if (!o_.throw_on.empty() && text.find(o_.throw_on) != std::string_view::npos)
      throw ht::Error("test tokenizer refuses this text");  // as the real ones do (ht::Error, no file named)
    std::vector<int32_t> ids;
    for (std::size_t i = 0; i < text.size();) {
      bool special = false;
      if (parse_special)
        for (const auto& [piece, id] : specials())
          if (text.substr(i, piece.size()) == piece) {
            ids.push_back(id);
            i += piece.size();
            special = true;
            break;
          }
      if (special) continue;
      const auto b = static_cast<unsigned char>(text[i++]);
      ids.push_back(static_cast<int32_t>(b) == o_.bad_id_for ? static_cast<int32_t>(o_.vocab_size) : b);
    }
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id < 256) {
        s += static_cast<char>(id);
        continue;
      }
      for (const auto& [piece, sid] : specials())
        if (sid == id) s += piece;
    }
    return s;
  }
  int64_t vocab_size() const override { return o_.vocab_size; }
  std::optional<int32_t> bos_id() const override { return o_.bos ? std::optional<int32_t>(256) : std::nullopt; }
  std::optional<int32_t> eos_id() const override { return o_.eos ? std::optional<int32_t>(257) : std::nullopt; }
  std::optional<int32_t> token_to_id(std::string_view piece) const override {
    for (const auto& [p, id] : specials())
      if (p == piece) return id;
    return std::nullopt;
  }
  std::string fingerprint() const override { return o_.fingerprint; }

  static const std::map<std::string, int32_t>& specials() {
    static const std::map<std::string, int32_t> s{{"<|begin_of_text|>", 256},
                                                  {"<|end_of_text|>", 257},
                                                  {"<|start_header_id|>", 258},
                                                  {"<|end_header_id|>", 259},
                                                  {"<|eot_id|>", 260}};
    return s;
  }

 private:
  ByteTokenizerOptions o_;
};

// A fresh folder under the temp directory for this test program, removed at exit.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("ht_text_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    } cleanup{d};
    return d;
  }();
  return dir;
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

}  // namespace text_test
