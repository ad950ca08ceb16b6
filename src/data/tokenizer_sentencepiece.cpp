// SentencePiece engine: a `tokenizer.model` (Llama 1/2) through libsentencepiece. Encoding adds no BOS/EOS
// (the model's own options decide normalisation and the dummy "▁" prefix); BOS, EOS and the special pieces
// come from the model. With parse_special, the text is split on the control and unknown pieces ("<s>",
// "</s>", "<unk>") and each piece of text between them is encoded on its own, as transformers' Llama
// tokenizers do (so each such piece gets the dummy prefix).
#include "data/tokenizer_engines.h"

#ifdef HADATRAIN_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>

#include <algorithm>
#include <utility>
#include <vector>
#endif

namespace ht::data::detail {

#ifdef HADATRAIN_HAVE_SENTENCEPIECE
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::filesystem::path& file) : file_(file.string()) {
    const std::string bytes = read_file_bytes(file);
    HT_CHECK(!bytes.empty(), "{}: empty file (expected a SentencePiece model)", file_);
    const auto status = sp_.LoadFromSerializedProto(bytes);
    HT_CHECK(status.ok(), "{}: not a readable SentencePiece model ({}); a truncated download? "
             "tools/fetch_lm_data.sh fetches the Llama-2 tokenizer.model", file_, status.ToString());
    HT_CHECK(sp_.GetPieceSize() > 0, "{}: the SentencePiece model has no pieces", file_);
    fingerprint_ = "sentencepiece:" + fnv1a_hex(bytes);
    for (int id = 0; id < sp_.GetPieceSize(); ++id) {
      if ((sp_.IsControl(id) || sp_.IsUnknown(id)) && !sp_.IdToPiece(id).empty())
        specials_.emplace_back(sp_.IdToPiece(id), id);
    }
    chunkable_ = words_are_independent();
    // Longest first, so a special that is a prefix of another never wins over it.
    std::sort(specials_.begin(), specials_.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }

  std::string kind() const override { return "sentencepiece"; }

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override {
    std::vector<int32_t> out;
    if (!parse_special) {
      encode_plain(text, out);
      return out;
    }
    size_t start = 0, pos = 0;
    while (pos < text.size()) {
      const std::pair<std::string, int>* hit = nullptr;
      for (const auto& s : specials_) {
        if (text.compare(pos, s.first.size(), s.first) == 0) {
          hit = &s;
          break;
        }
      }
      if (!hit) {
        ++pos;
        continue;
      }
      encode_plain(text.substr(start, pos - start), out);
      out.push_back(hit->second);
      pos += hit->first.size();
      start = pos;
    }
    encode_plain(text.substr(start), out);
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    for (size_t i = 0; i < v.size(); ++i)
      HT_CHECK(v[i] >= 0 && v[i] < sp_.GetPieceSize(), "{}: token id {} (position {}) is outside the "
               "vocabulary [0, {})", file_, v[i], i, sp_.GetPieceSize());
    std::string text;
    const auto status = sp_.Decode(v, &text);
    HT_CHECK(status.ok(), "{}: SentencePiece could not decode {} ids: {}", file_, v.size(), status.ToString());
    return text;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int32_t> bos_id() const override { return optional_id(sp_.bos_id()); }
  std::optional<int32_t> eos_id() const override { return optional_id(sp_.eos_id()); }

  std::optional<int32_t> token_to_id(std::string_view piece) const override {
    const int id = sp_.PieceToId(piece);  // the unknown id for pieces it does not have
    if (id < 0 || id >= sp_.GetPieceSize() || sp_.IdToPiece(id) != piece) return std::nullopt;
    return id;
  }

  std::string fingerprint() const override { return fingerprint_; }

 private:
  static std::optional<int32_t> optional_id(int id) {
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }

  // Note [SentencePiece chunks]: libsentencepiece's encoding time grows faster than linearly with the
  // length of one input (a 50 kB line takes seconds), and whole documents come here. A long text is
  // therefore encoded in chunks of about kChunkBytes, cut at a single space between an ASCII non-space
  // character and an ASCII letter or digit ("x y" -> "x" | "y"). Each chunk gets the dummy prefix "▁",
  // which is exactly the "▁" the cut space would have become, and no piece can reach across "x▁y" when no
  // piece of the model has a "▁" after another character (words_are_independent). Models where that does
  // not hold, or without a dummy prefix, are encoded in one call.
  static constexpr size_t kChunkBytes = 1024;

  bool words_are_independent() const {
    std::vector<std::string> probe;
    if (!sp_.Encode("a", &probe).ok() || probe.empty() || probe[0].rfind("\xe2\x96\x81", 0) != 0) return false;
    const std::string_view ws = "\xe2\x96\x81";  // "▁"
    for (int id = 0; id < sp_.GetPieceSize(); ++id) {
      const std::string_view p = sp_.IdToPiece(id);
      const size_t first_other = p.find_first_not_of(ws);  // bytes of "▁" at the start are fine
      if (first_other != std::string_view::npos && p.find(ws, first_other) != std::string_view::npos) return false;
    }
    return true;
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    while (chunkable_ && text.size() > 2 * kChunkBytes) {
      size_t cut = kChunkBytes;
      auto ascii_graph = [](char c) { return c > 0x20 && c < 0x7F; };
      auto ascii_alnum = [](char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); };
      while (cut + 1 < text.size() && !(text[cut] == ' ' && ascii_graph(text[cut - 1]) && ascii_alnum(text[cut + 1])))
        ++cut;
      if (cut + 1 >= text.size()) break;
      encode_call(text.substr(0, cut), out);
      text.remove_prefix(cut + 1);
    }
    encode_call(text, out);
  }

  void encode_call(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    HT_CHECK(status.ok(), "{}: SentencePiece could not encode {} bytes of text: {}", file_, text.size(),
             status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string file_;
  std::string fingerprint_;
  sentencepiece::SentencePieceProcessor sp_;
  bool chunkable_ = false;  // Note [SentencePiece chunks]
  std::vector<std::pair<std::string, int>> specials_;  // control/unknown piece text -> id, longest first
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model_file) {
  return std::make_unique<SentencePieceTokenizer>(model_file);
}

#else

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model_file) {
  throw UnsupportedTokenizer(fmt::format(
      "{}: hadatrain was built without SentencePiece, so it cannot read SentencePiece models (install "
      "libsentencepiece-dev, e.g. through tools/setup.sh, and re-run cmake)", model_file.string()));
}

#endif

}  // namespace ht::data::detail
