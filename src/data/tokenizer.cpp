// load_tokenizer: picks the engine for a file or a model folder (tokenizer.json first, as transformers' fast
// tokenizers do, then tokenizer.model), and the file helpers the engines share.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "data/tokenizer_engines.h"
#include "hadatrain/core/digest.h"

namespace ht::data {
namespace detail {

std::string read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "{}: cannot open the file", path.string());
  std::ostringstream out;
  out << in.rdbuf();
  HT_CHECK(!in.bad(), "{}: read error", path.string());
  return std::move(out).str();
}

std::string fnv1a_hex(std::string_view bytes) { return fmt::format("{:016x}", Fnv1a().add(bytes).value()); }

}  // namespace detail

namespace {

// "~/x" -> "$HOME/x", so paths written in configs the way a shell user writes them work.
std::filesystem::path expand_home(const std::filesystem::path& path) {
  const std::string s = path.string();
  if (s == "~" || s.rfind("~/", 0) == 0) {
    if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / s.substr(s.size() > 1 ? 2 : 1);
  }
  return path;
}

}  // namespace

std::size_t settled_length(std::string_view text) {
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8
  std::size_t end = text.size();
  while (end >= kReplacement.size() && text.substr(end - kReplacement.size(), kReplacement.size()) == kReplacement)
    end -= kReplacement.size();
  return end;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path_in) {
  namespace fs = std::filesystem;
  const fs::path path = expand_home(path_in);
  std::error_code ec;
  HT_CHECK(fs::exists(path, ec), "tokenizer: {} does not exist (expected a tokenizer.json, a SentencePiece "
           "tokenizer.model or a folder holding one; tools/fetch_lm_data.sh fetches the Llama tokenizers)",
           path.string());
  if (!fs::is_directory(path, ec)) {
    if (path.extension() == ".json") return detail::load_bpe(path, path.parent_path() / "tokenizer_config.json");
    return detail::load_sentencepiece(path);
  }
  const fs::path json = path / "tokenizer.json";
  const fs::path model = path / "tokenizer.model";
  const bool has_json = fs::is_regular_file(json, ec);
  const bool has_model = fs::is_regular_file(model, ec);
  HT_CHECK(has_json || has_model, "tokenizer: the folder {} holds neither tokenizer.json nor tokenizer.model",
           path.string());
  std::string json_skipped;
  if (has_json) {
    try {
      return detail::load_bpe(json, path / "tokenizer_config.json");
    } catch (const detail::UnsupportedTokenizer& e) {
      if (!has_model) throw;
      // The folder also has the SentencePiece model (Llama 1/2 ship both): use it.
      json_skipped = e.what();
    }
  }
  try {
    return detail::load_sentencepiece(model);
  } catch (const Error& e) {
    if (json_skipped.empty()) throw;
    throw Error(fmt::format("{}\n(tokenizer.json was not used either: {})", e.what(), json_skipped));
  }
}

bool tokenizer_engine_built(std::string_view kind) {
#ifdef HADATRAIN_HAVE_SENTENCEPIECE
  if (kind == "sentencepiece") return true;
#endif
#ifdef HADATRAIN_HAVE_PCRE2
  if (kind == "bpe") return true;
#endif
  HT_CHECK(kind == "sentencepiece" || kind == "bpe", "unknown tokenizer engine '{}' (expected sentencepiece or bpe)", kind);
  return false;
}

}  // namespace ht::data
