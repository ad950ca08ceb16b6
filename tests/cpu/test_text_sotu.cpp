// Real text through the real tokenizer: the State-of-the-Union speeches of the 1790s (a glob over the 233 of
// the corpus, so the test takes well under a second) with the Llama-2 SentencePiece model, as
// tools/fetch_lm_data.sh installs them under ${HADATRAIN_CACHE:-~/.cache/hadatrain}/lm. Checks the
// token store against Tokenizer::encode file by file, the u16 token file, reuse on the second open and the
// packed windows. Without the fetched files the test says so and checks nothing.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hadatrain/data/text_dataset.h"
#include "hadatrain/data/text_store.h"
#include "support/catch.h"
#include "test_text_support.h"

using namespace ht;
using namespace ht::data;
namespace fs = std::filesystem;

namespace {

fs::path lm_cache() {
  const char* c = std::getenv("HADATRAIN_CACHE");
  if (c != nullptr && *c != '\0') return fs::path(c) / "lm";
  const char* home = std::getenv("HOME");
  return home ? fs::path(home) / ".cache" / "hadatrain" / "lm" : fs::path();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("SOTU 1790s with the Llama-2 tokenizer: tokenised once into u16 ids equal to encode(), then reused", "[text]") {
  const fs::path sotu = lm_cache() / "sotu", model = lm_cache() / "llama2" / "tokenizer.model";
  if (!fs::exists(sotu) || !fs::exists(model)) {
    WARN("no " << sotu << " or " << model << ": run tools/fetch_lm_data.sh to include this test");
    return;
  }
  if (!tokenizer_engine_built("sentencepiece")) {
    CHECK_THROWS_WITH(load_tokenizer(model), HasSubstr("built without SentencePiece"));
    WARN("built without libsentencepiece: the SOTU check needs it");
    return;
  }
  const auto tok = load_tokenizer(model);
  TokenStoreOptions o;
  o.sources = {(sotu / "179*.txt").string()};
  o.cache_dir = text_test::scratch() / "sotu_cache";
  const auto t0 = std::chrono::steady_clock::now();
  const auto store = TokenStore::open(o, *tok);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("tokenised the 1790s speeches in " << secs << " s");
  CHECK(store->cache_use() == CacheUse::built);
  CHECK(store->num_documents() == 10);  // 1790 .. 1799
  CHECK(store->token_bytes() == 2);
  CHECK(store->vocab_size() == 32000);
  CHECK(store->num_tokens() > 20'000);
  CHECK(store->document_file(0).filename() == "1790_george_washington_n.txt");
  CHECK(store->document_file(9).filename().string().substr(0, 4) == "1799");

  for (int64_t d : {int64_t{0}, int64_t{5}, int64_t{9}}) {
    const std::vector<int32_t> want = tok->encode(slurp(store->document_file(d)));
    std::vector<int64_t> got(static_cast<std::size_t>(store->document_size(d)));
    store->copy_tokens(store->document_begin(d), store->document_size(d), got.data());
    CHECK(std::vector<int64_t>(want.begin(), want.end()) == got);
  }

  const auto again = TokenStore::open(o, *tok);
  CHECK(again->cache_use() == CacheUse::reused);
  CHECK(again->num_tokens() == store->num_tokens());

  PackedTextDataset ds(store, pack_options(*tok, 256));
  CHECK(ds.stream_size() == store->num_tokens() + 2 * 10);  // BOS <s> and EOS </s> around every speech
  std::vector<int64_t> in(256), lab(256);
  ds.get(0, in.data(), lab.data());
  CHECK(in[0] == 1);  // <s>
  const std::vector<int32_t> ids(in.begin() + 1, in.end());
  CHECK_THAT(tok->decode(ids), HasSubstr("Fellow-Citizens of the Senate and House of Representatives"));
}
