// Fuzz target: the tokenizer.json (byte-level BPE) engine of data/tokenizer.h. Input: the first byte picks the
// part. Even: the rest is a tokenizer.json, loaded through load_tokenizer and, when it loads, used to encode a
// fixed text (plain and with special tokens parsed) and decode the ids back. Odd: the rest is text, encoded by a
// small valid tokenizer (the 256 byte-level pieces, three merges, one special token, Llama 3's pre-tokenisation
// regex) and decoded back, which must give the text again when it is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "hadatrain/core/error.h"
#include "hadatrain/data/tokenizer.h"
#include "fuzz_input.h"

namespace {

// GPT-2's byte-to-character map of byte-level BPE, as UTF-8: printable bytes stand for themselves, the others
// for U+0100 + their rank among the non-printable ones.
std::string byte_char(int b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string small_tokenizer_json() {
  using nlohmann::json;
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = id++;
  const std::string sp = byte_char(' ');
  for (const std::string& piece : {sp + "t", std::string("he"), sp + "the"}) vocab[piece] = id++;
  const json merges = json::array({sp + " t", "h e", sp + "t he"});
  const std::string regex =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const json t = {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", id}, {"content", "<|eot_id|>"}, {"single_word", false}, {"lstrip", false},
                                     {"rstrip", false}, {"normalized", false}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                        {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", true},
        {"vocab", vocab}, {"merges", merges}}}};
  return t.dump();
}

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

// Encodes text (plain and with special tokens parsed) and decodes it back; with `round_trip`, a plain encoding
// must decode to the text (byte-level BPE with every byte in its vocabulary round-trips any valid UTF-8).
void use(const ht::data::Tokenizer& tok, const std::string& text, bool round_trip) {
  for (const bool special : {false, true}) {
    const auto ids = tok.encode(text, special);
    const std::string back = tok.decode(ids);
    if (round_trip && !special && back != text) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      const auto path = ht::fuzz::write_input("tokenizer.json", data + 1, size - 1);
      const auto tok = ht::data::load_tokenizer(path);
      use(*tok, "Hello world, the <|eot_id|> 123 \xc3\xbf\n", false);
    } else {
      static const std::unique_ptr<ht::data::Tokenizer> small = [] {
        const std::string json = small_tokenizer_json();
        const auto path = ht::fuzz::write_input("small_tokenizer.json", reinterpret_cast<const uint8_t*>(json.data()),
                                                json.size());
        return ht::data::load_tokenizer(path);
      }();
      if (valid_utf8(rest)) use(*small, rest, true);
    }
  } catch (const ht::Error&) {
  }
  return 0;
}
