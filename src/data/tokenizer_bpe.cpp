// Hugging Face tokenizer.json engine for byte-level BPE models (GPT-2 style; Llama 3).
//
// Encoding, as the `tokenizers` library does for such a file:
//   1. split the text on added tokens (special ones only with parse_special; non-special ones always);
//   2. pre-tokenise each stretch between them: the `Split` regexes (behavior "Isolated") and/or the
//      ByteLevel pre-tokenizer's own GPT-2 regex, through PCRE2;
//   3. each piece ("word") -> its bytes -> one symbol per byte (the ByteLevel alphabet) -> BPE merges by
//      rank; with `ignore_merges` (Llama 3) a word that is itself in the vocabulary is one token.
// Words repeat a lot in real text, so step 3 is cached per word.
// Decoding maps each token back to its bytes and concatenates them, without transformers'
// clean_up_tokenization_spaces, so decode(encode(x)) == x for every valid UTF-8 x.
#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>

#include "data/tokenizer_bpe.h"
#include "data/tokenizer_engines.h"

namespace ht::data::detail {
namespace {

using nlohmann::json;

// The GPT-2 pre-tokenisation pattern, which ByteLevel uses when its use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const std::filesystem::path& json_file, const std::filesystem::path& config_file)
      : file_(json_file.string()) {
    const std::string bytes = read_file_bytes(json_file);
    json j;
    try {
      j = json::parse(bytes);
    } catch (const json::exception& e) {
      HT_FAIL("{}: not valid JSON ({}); a truncated or damaged file? tools/fetch_lm_data.sh fetches the "
              "Llama-3 tokenizer.json", file_, e.what());
    }
    std::string config_bytes;
    std::error_code ec;
    if (!config_file.empty() && std::filesystem::is_regular_file(config_file, ec))
      config_bytes = read_file_bytes(config_file);
    try {
      parse(j);
      if (!config_bytes.empty()) parse_config(config_file.string(), config_bytes);
    } catch (const json::exception& e) {  // a key of the wrong type: name the file
      HT_FAIL("{}: unexpected content: {}", file_, e.what());
    }
    fingerprint_ = "bpe:" + fnv1a_hex(bytes) + ":" + fnv1a_hex(config_bytes);
  }

  std::string kind() const override { return "bpe"; }

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override {
    std::vector<int32_t> out;
    std::vector<std::string_view> pieces, next;
    size_t start = 0, pos = 0;
    while (pos < text.size()) {
      const AddedToken* hit = match_added(text, pos, parse_special);
      if (!hit) {
        ++pos;
        continue;
      }
      size_t end_text = pos;
      if (hit->lstrip)
        while (end_text > start && is_space(text[end_text - 1])) --end_text;
      encode_text(text.substr(start, end_text - start), out, pieces, next);
      out.push_back(hit->id);
      pos += hit->content.size();
      if (hit->rstrip)
        while (pos < text.size() && is_space(text[pos])) ++pos;
      start = pos;
    }
    encode_text(text.substr(start), out, pieces, next);
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      HT_CHECK(id >= 0 && id < vocab_size(), "{}: token id {} (position {}) is outside the vocabulary [0, {})",
               file_, id, i, vocab_size());
      HT_CHECK(has_token_[id], "{}: token id {} (position {}) has no token (a gap in the vocabulary)", file_,
               id, i);
      out += id_bytes_[id];
    }
    return out;
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }

  std::optional<int32_t> token_to_id(std::string_view piece) const override {
    for (const auto& a : added_)
      if (a.content == piece) return a.id;
    auto it = vocab_.find(std::string(piece));
    return it == vocab_.end() ? std::nullopt : std::optional<int32_t>(it->second);
  }

  std::string fingerprint() const override { return fingerprint_; }

 private:
  [[noreturn]] void unsupported(const std::string& what) const {
    throw UnsupportedTokenizer(fmt::format("{}: {} (this engine reads byte-level BPE tokenizer.json files, "
                                           "as Llama 3 and GPT-2 use)", file_, what));
  }

  static std::string type_of(const json& node) {
    return node.is_object() && node.contains("type") && node["type"].is_string() ? node["type"].get<std::string>()
                                                                                   : node.dump();
  }

  // A token id of the file: an integer from 0 to 2^31 - 1 (a float or a string is refused, not truncated; an
  // unsigned value beyond int64 reads as negative).
  int32_t token_id(const json& v, const std::string& what) const {
    const int64_t id = v.is_number_integer() ? v.get<int64_t>() : -1;
    HT_CHECK(id >= 0 && id < (int64_t{1} << 31), "{}: {} has id {}, which is not an integer from 0 to 2^31 - 1", file_,
             what, v.dump());
    return static_cast<int32_t>(id);
  }

  void parse(const json& j) {
    HT_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
             "{}: no \"model\" object (expected a Hugging Face tokenizer.json)", file_);
    const json& m = j["model"];
    const std::string type = m.value("type", m.contains("merges") ? "BPE" : "");
    if (type != "BPE") unsupported(fmt::format("model type '{}' is not supported", type));
    if (m.value("byte_fallback", false)) unsupported("a BPE model with byte_fallback (SentencePiece style)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(key) && !m[key].is_null() && !m[key].get<std::string>().empty())
        unsupported(fmt::format("model.{} is not supported", key));
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
      unsupported("BPE dropout is not supported");
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      unsupported(fmt::format("normalizer '{}' is not supported", type_of(j["normalizer"])));
    if (!j.contains("decoder") || type_of(j["decoder"]) != "ByteLevel")
      unsupported(fmt::format("decoder '{}' is not supported (expected ByteLevel)",
                              j.contains("decoder") ? type_of(j["decoder"]) : "none"));
    parse_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json());
    ignore_merges_ = m.value("ignore_merges", false);

    // The vocabulary and the added tokens; ids may leave no gaps only if the file says so.
    HT_CHECK(m.contains("vocab") && m["vocab"].is_object(), "{}: model.vocab is missing or not an object", file_);
    int32_t max_id = -1;
    for (const auto& [token, id_node] : m["vocab"].items()) {
      const int32_t id = token_id(id_node, fmt::format("model.vocab[\"{}\"]", token));
      HT_CHECK(vocab_.emplace(token, id).second, "{}: model.vocab has \"{}\" twice", file_, token);
      max_id = std::max(max_id, id);
    }
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      for (const json& a : j["added_tokens"]) {
        AddedToken t{a.at("content").get<std::string>(), token_id(a.at("id"), "added token " + a.dump()),
                     a.value("special", false), a.value("lstrip", false), a.value("rstrip", false)};
        HT_CHECK(!t.content.empty(), "{}: added token {} has empty content", file_, a.dump());
        if (a.value("single_word", false))
          unsupported(fmt::format("added token \"{}\" with single_word is not supported", t.content));
        max_id = std::max(max_id, t.id);
        added_.push_back(std::move(t));
      }
    }
    HT_CHECK(max_id >= 0, "{}: the vocabulary is empty", file_);
    id_bytes_.assign(max_id + 1, std::string());
    has_token_.assign(max_id + 1, false);
    for (const auto& [token, id] : vocab_) {
      HT_CHECK(!has_token_[id], "{}: id {} names two tokens in model.vocab", file_, id);
      has_token_[id] = true;
      id_bytes_[id] = token_bytes(token);
    }
    for (const auto& a : added_) {  // an added token's text is raw text, not byte-level symbols
      has_token_[a.id] = true;
      id_bytes_[a.id] = a.content;
      added_by_first_byte_[static_cast<unsigned char>(a.content[0])].push_back(&a - added_.data());
    }
    for (auto& list : added_by_first_byte_)  // longest first, so the longest match at a position wins
      std::sort(list.begin(), list.end(),
                [&](size_t x, size_t y) { return added_[x].content.size() > added_[y].content.size(); });
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(byte_to_unicode(static_cast<uint8_t>(b)));
      if (it == vocab_.end())
        unsupported(fmt::format("the vocabulary lacks the byte-level symbol for byte 0x{:02X}, so it is not "
                                "a byte-level BPE vocabulary", b));
      byte_id_[b] = it->second;
    }
    parse_merges(m);
  }

  // The bytes a vocabulary token stands for: each byte-level symbol back to its byte (a character outside
  // the alphabet stays as its UTF-8 text, as the ByteLevel decoder does).
  static std::string token_bytes(const std::string& token) {
    std::string out;
    for (size_t i = 0; i < token.size();) {
      const unsigned char lead = static_cast<unsigned char>(token[i]);
      const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      const std::string_view sym = std::string_view(token).substr(i, len);
      const int b = unicode_to_byte(sym);
      if (b >= 0) out.push_back(static_cast<char>(b));
      else out.append(sym);
      i += len;
    }
    return out;
  }

  void parse_merges(const json& m) {
    HT_CHECK(m.contains("merges") && m["merges"].is_array(), "{}: model.merges is missing or not an array", file_);
    int32_t rank = 0;
    for (const json& entry : m["merges"]) {
      std::string left, right;
      if (entry.is_string()) {  // "a b"
        const std::string s = entry.get<std::string>();
        const size_t sp = s.find(' ');
        HT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
                 "{}: model.merges[{}] = \"{}\" is not two tokens separated by one space", file_, rank, s);
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else {  // ["a", "b"]
        HT_CHECK(entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string(),
                 "{}: model.merges[{}] = {} is neither \"a b\" nor [\"a\", \"b\"]", file_, rank, entry.dump());
        left = entry[0].get<std::string>();
        right = entry[1].get<std::string>();
      }
      const auto l = vocab_.find(left), r = vocab_.find(right), merged = vocab_.find(left + right);
      HT_CHECK(l != vocab_.end() && r != vocab_.end() && merged != vocab_.end(),
               "{}: model.merges[{}] merges \"{}\" and \"{}\", but the vocabulary lacks {}", file_, rank, left,
               right, l == vocab_.end() ? left : r == vocab_.end() ? right : left + right);
      merges_.add(l->second, r->second, rank, merged->second);
      ++rank;
    }
  }

  // tokenizer.json's pre_tokenizer: ByteLevel alone, or a Sequence of Split (Isolated) regexes and a
  // ByteLevel. ByteLevel with use_regex adds the GPT-2 pattern after the Splits.
  void parse_pre_tokenizer(const json& p) {
    std::vector<const json*> steps;
    if (type_of(p) == "Sequence") {
      for (const json& s : p.at("pretokenizers")) steps.push_back(&s);
    } else if (!p.is_null()) {
      steps.push_back(&p);
    }
    bool byte_level = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& s = *steps[i];
      const std::string type = type_of(s);
      const std::string where = fmt::format("{}: pre_tokenizer step {} ({})", file_, i, type);
      if (type == "Split") {
        if (s.value("behavior", "") != "Isolated" || s.value("invert", false))
          unsupported(fmt::format("a Split pre-tokenizer with behavior '{}' and invert {} is not supported "
                                  "(only Isolated, not inverted)", s.value("behavior", ""), s.value("invert", false)));
        const json& pat = s.at("pattern");
        const bool literal = pat.contains("String");
        splits_.push_back(std::make_unique<SplitRegex>(pat.at(literal ? "String" : "Regex").get<std::string>(),
                                                       literal, where));
      } else if (type == "ByteLevel") {
        byte_level = true;
        add_prefix_space_ = s.value("add_prefix_space", false);
        if (s.value("use_regex", true)) splits_.push_back(std::make_unique<SplitRegex>(kGpt2Pattern, false, where));
        HT_CHECK(i + 1 == steps.size(), "{}: ByteLevel must be the last pre-tokenizer", where);
      } else {
        unsupported(fmt::format("pre-tokenizer '{}' is not supported", type));
      }
    }
    if (!byte_level) unsupported("the pre-tokenizer has no ByteLevel step, so the model is not byte-level");
  }

  // bos_token / eos_token of tokenizer_config.json: a string or {"content": ...}.
  void parse_config(const std::string& path, const std::string& bytes) {
    json c;
    try {
      c = json::parse(bytes);
    } catch (const json::exception& e) {
      HT_FAIL("{}: not valid JSON ({})", path, e.what());
    }
    auto special = [&](const char* key) -> std::optional<int32_t> {
      if (!c.contains(key) || c[key].is_null()) return std::nullopt;
      const json& v = c[key];
      const std::string text = v.is_string() ? v.get<std::string>() : v.at("content").get<std::string>();
      const auto id = token_to_id(text);
      HT_CHECK(id.has_value(), "{}: {} \"{}\" is not a token of {}", path, key, text, file_);
      return id;
    };
    bos_ = special("bos_token");
    eos_ = special("eos_token");
  }

  // The added token that starts at text[pos], if any (special ones only when parse_special).
  const AddedToken* match_added(std::string_view text, size_t pos, bool parse_special) const {
    for (size_t k : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& a = added_[k];
      if ((parse_special || !a.special) && text.compare(pos, a.content.size(), a.content) == 0) return &a;
    }
    return nullptr;
  }

  void encode_text(std::string_view text, std::vector<int32_t>& out, std::vector<std::string_view>& pieces,
                   std::vector<std::string_view>& next) const {
    if (text.empty()) return;
    std::string prefixed;
    if (add_prefix_space_ && text[0] != ' ') {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    pieces.assign(1, text);
    for (const auto& re : splits_) {
      next.clear();
      for (std::string_view p : pieces) re->split(p, next);
      pieces.swap(next);
    }
    for (std::string_view word : pieces) encode_word(word, out);
  }

  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    {
      std::shared_lock lock(cache_mutex_);
      auto it = cache_.find(word);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    if (ignore_merges_) {
      std::string symbols;
      for (unsigned char b : word) symbols += byte_to_unicode(b);
      if (auto it = vocab_.find(symbols); it != vocab_.end()) ids.push_back(it->second);
    }
    if (ids.empty()) {
      ids.reserve(word.size());
      for (unsigned char b : word) ids.push_back(byte_id_[b]);
      merges_.apply(ids);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() >= kMaxCachedWords) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static constexpr size_t kMaxCachedWords = 1 << 20;

  std::string file_;
  std::string fingerprint_;
  std::unordered_map<std::string, int32_t> vocab_;  // byte-level token text -> id
  std::vector<AddedToken> added_;
  std::array<std::vector<size_t>, 256> added_by_first_byte_;  // indices into added_, longest first
  std::vector<std::string> id_bytes_;                          // id -> the bytes it decodes to
  std::vector<bool> has_token_;
  std::array<int32_t, 256> byte_id_{};  // byte -> id of its byte-level symbol
  MergeTable merges_;
  std::vector<std::unique_ptr<SplitRegex>> splits_;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> bos_, eos_;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_bpe(const std::filesystem::path& json_file, const std::filesystem::path& config_file) {
  return std::make_unique<BpeTokenizer>(json_file, config_file);
}

}  // namespace ht::data::detail
