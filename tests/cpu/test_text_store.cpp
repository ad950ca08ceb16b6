// The token store: source listing order, the cache (built once, reused, rebuilt when a source or the
// tokenizer changes, never trusted when truncated or corrupt, no partial file after a failed tokenisation),
// u16/u32 token files, thread-count independence and out-of-vocabulary ids.
#include <filesystem>
#include <fstream>

#include "hadatrain/core/error.h"
#include "hadatrain/data/text_store.h"
#include "support/catch.h"
#include "test_text_support.h"

using namespace ht;
using namespace ht::data;
using text_test::ByteTokenizer;
using text_test::ByteTokenizerOptions;
namespace fs = std::filesystem;

namespace {

std::vector<int64_t> all_tokens(const TokenStore& s) {
  std::vector<int64_t> out(static_cast<std::size_t>(s.num_tokens()));
  s.copy_tokens(0, s.num_tokens(), out.data());
  return out;
}

std::vector<int64_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// A corpus folder `name` with three documents (one nested) and a file of another extension.
fs::path make_corpus(const std::string& name) {
  const fs::path d = text_test::scratch() / name;
  text_test::write_text(d / "b.txt", "second doc");
  text_test::write_text(d / "a.txt", "first");
  text_test::write_text(d / "sub" / "c.txt", "third one");
  text_test::write_text(d / "notes.json", "{}");
  return d;
}

TokenStoreOptions options_for(const fs::path& corpus, const std::string& cache) {
  TokenStoreOptions o;
  o.sources = {corpus.string()};
  o.cache_dir = text_test::scratch() / cache;
  return o;
}

}  // namespace

TEST_CASE("list_text_files: folders sorted and filtered by extension, files and patterns in source order", "[text]") {
  const fs::path d = make_corpus("listing");
  const auto files = list_text_files({d.string()}, {".txt"});
  REQUIRE(files.size() == 3);
  CHECK(files[0].filename() == "a.txt");
  CHECK(files[1].filename() == "b.txt");
  CHECK(files[2] == fs::canonical(d / "sub" / "c.txt"));

  // A file named explicitly comes first and is not repeated by the folder after it; patterns expand sorted.
  const auto mixed = list_text_files({(d / "b.txt").string(), d.string()}, {"txt"});
  REQUIRE(mixed.size() == 3);
  CHECK(mixed[0].filename() == "b.txt");
  CHECK(mixed[1].filename() == "a.txt");
  const auto pattern = list_text_files({(d / "*.txt").string()}, {".txt"});
  REQUIRE(pattern.size() == 2);
  CHECK(pattern[0].filename() == "a.txt");

  CHECK_THROWS_WITH(list_text_files({(d / "missing.txt").string()}, {".txt"}),
                    HasSubstr("missing.txt does not exist"));
  CHECK_THROWS_WITH(list_text_files({(d / "*.md").string()}, {".txt"}),
                    HasSubstr("matches no file"));
  CHECK_THROWS_WITH(list_text_files({d.string()}, {".md"}), HasSubstr("no file with extension .md"));
}

TEST_CASE("list_text_files: a folder's links are followed; a link loop is an error naming the link", "[text]") {
  const fs::path d = make_corpus("linked");
  const fs::path shared = text_test::scratch() / "linked_shared";
  text_test::write_text(shared / "s.txt", "shared text");
  fs::create_directory_symlink(shared, d / "shared");
  fs::create_symlink(text_test::scratch() / "gone.txt", d / "dangling.txt");  // skipped: no file to read
  CHECK(list_text_files({d.string()}, {".txt"}).size() == 4);
  fs::create_directory_symlink(d, d / "sub" / "up");
  CHECK_THROWS_WITH(list_text_files({d.string()}, {".txt"}),
                    HasSubstr("text source " + d.string() + ": " + (d / "sub" / "up").string() +
                              " is a symbolic link loop: it leads to " + fs::canonical(d).string()));
}

TEST_CASE("TokenStore: documents and tokens are the files' bytes in order, and the cache is reused", "[text]") {
  const fs::path d = make_corpus("reuse");
  ByteTokenizer tok;
  auto s1 = TokenStore::open(options_for(d, "cache_reuse"), tok);
  CHECK(s1->cache_use() == CacheUse::built);
  REQUIRE(s1->num_documents() == 3);
  CHECK(s1->token_bytes() == 2);
  CHECK(s1->document_size(0) == 5);
  CHECK(s1->document_begin(1) == 5);
  CHECK(s1->document_file(2).filename() == "c.txt");
  CHECK(s1->document_max_id(0) == 't');
  CHECK(all_tokens(*s1) == bytes_of("firstsecond docthird one"));

  auto s2 = TokenStore::open(options_for(d, "cache_reuse"), tok);
  CHECK(s2->cache_use() == CacheUse::reused);
  CHECK(s2->cache_file() == s1->cache_file());
  CHECK(all_tokens(*s2) == all_tokens(*s1));
  // One cache file and no temporaries in the folder.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(text_test::scratch() / "cache_reuse")) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 1);
}

TEST_CASE("TokenStore: a changed source or another tokenizer re-tokenises", "[text]") {
  const fs::path d = make_corpus("invalidate");
  const auto opts = options_for(d, "cache_invalidate");
  ByteTokenizer tok;
  CHECK(TokenStore::open(opts, tok)->cache_use() == CacheUse::built);
  CHECK(TokenStore::open(opts, tok)->cache_use() == CacheUse::reused);

  SECTION("touching a source (same bytes, new mtime)") {
    fs::last_write_time(d / "a.txt", fs::last_write_time(d / "a.txt") + std::chrono::seconds(5));
    CHECK(TokenStore::open(opts, tok)->cache_use() == CacheUse::built);
    CHECK(TokenStore::open(opts, tok)->cache_use() == CacheUse::reused);
  }
  SECTION("same size and mtime, other bytes (the content hash)") {
    const auto t = fs::last_write_time(d / "a.txt");
    text_test::write_text(d / "a.txt", "FIRST");
    fs::last_write_time(d / "a.txt", t);
    auto s = TokenStore::open(opts, tok);
    CHECK(s->cache_use() == CacheUse::built);
    CHECK(s->token(0) == 'F');
  }
  SECTION("another tokenizer fingerprint") {
    ByteTokenizer other({.fingerprint = "bytes-v2"});
    auto s = TokenStore::open(opts, other);
    CHECK(s->cache_use() == CacheUse::built);
    CHECK(TokenStore::open(opts, other)->cache_use() == CacheUse::reused);
  }
  SECTION("a file added to the folder") {
    text_test::write_text(d / "d.txt", "fourth");
    auto s = TokenStore::open(opts, tok);
    CHECK(s->cache_use() == CacheUse::built);
    CHECK(s->num_documents() == 4);
  }
}

TEST_CASE("TokenStore: a truncated or corrupt cache file is rebuilt, not trusted", "[text]") {
  const fs::path d = make_corpus("corrupt");
  const auto opts = options_for(d, "cache_corrupt");
  ByteTokenizer tok;
  const fs::path file = TokenStore::open(opts, tok)->cache_file();
  const auto good_size = fs::file_size(file);
  const std::vector<int64_t> expected = bytes_of("firstsecond docthird one");

  SECTION("truncated") { fs::resize_file(file, good_size - 3); }
  SECTION("empty") { fs::resize_file(file, 0); }
  SECTION("one token byte flipped") {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 2);  // the second token
    f.put('#');
  }
  SECTION("header garbage") {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.write("XXXXXXXX", 8);
  }
  auto s = TokenStore::open(opts, tok);
  CHECK(s->cache_use() == CacheUse::built);
  CHECK(fs::file_size(file) == good_size);
  CHECK(all_tokens(*s) == expected);
}

TEST_CASE("TokenStore: a failed tokenisation leaves no cache behind", "[text]") {
  const fs::path d = make_corpus("failed");
  const auto opts = options_for(d, "cache_failed");
  ByteTokenizer refusing({.throw_on = "third"});
  // The tokenizer's error does not know the file; the store's names it.
  CHECK_THROWS_WITH(TokenStore::open(opts, refusing),
                    HasSubstr("tokenising " + (d / "sub" / "c.txt").string() + ": test tokenizer refuses"));
  CHECK(fs::is_empty(text_test::scratch() / "cache_failed"));  // no cache file, no temporary
  ByteTokenizer tok;
  CHECK(TokenStore::open(opts, tok)->cache_use() == CacheUse::built);
}

TEST_CASE("TokenStore: u32 tokens for a vocabulary beyond 16 bits; the same ids for any thread count", "[text]") {
  const fs::path d = text_test::scratch() / "threads";
  std::string all;
  for (int i = 0; i < 40; ++i) {
    std::string doc;
    for (int k = 0; k <= i * 7 % 23; ++k) doc += static_cast<char>('a' + (i + k) % 26);
    text_test::write_text(d / fmt::format("doc{:03d}.txt", i), doc);
    all += doc;
  }
  ByteTokenizer small;
  ByteTokenizer wide({.vocab_size = 70000, .fingerprint = "wide"});
  auto o1 = options_for(d, "cache_threads1");
  o1.num_threads = 1;
  auto o4 = options_for(d, "cache_threads4");
  o4.num_threads = 4;
  auto a = TokenStore::open(o1, small);
  auto b = TokenStore::open(o4, small);
  auto w = TokenStore::open(o4, wide);
  CHECK(a->token_bytes() == 2);
  CHECK(w->token_bytes() == 4);
  CHECK(all_tokens(*a) == bytes_of(all));
  CHECK(all_tokens(*b) == bytes_of(all));
  CHECK(all_tokens(*w) == bytes_of(all));
  for (int64_t doc = 0; doc < 40; ++doc) CHECK(b->document_begin(doc) == a->document_begin(doc));
}

TEST_CASE("TokenStore: an id outside the tokenizer's vocabulary names the file, the id and the size", "[text]") {
  const fs::path d = make_corpus("badid");
  ByteTokenizer broken({.bad_id_for = 'h'});  // "third one" holds an 'h'
  CHECK_THROWS_WITH(TokenStore::open(options_for(d, "cache_badid"), broken),
                    HasSubstr("c.txt") && HasSubstr("token id 261") &&
                        HasSubstr("vocabulary of size 261"));
}

TEST_CASE("default_token_cache_dir follows HADATRAIN_CACHE, then HOME", "[text]") {
  const char* old = std::getenv("HADATRAIN_CACHE");
  const std::string saved = old ? old : "";
  ::setenv("HADATRAIN_CACHE", "/tmp/htc", 1);
  CHECK(default_token_cache_dir() == fs::path("/tmp/htc/tokens"));
  ::setenv("HADATRAIN_CACHE", "", 1);
  CHECK(default_token_cache_dir() == fs::path(std::getenv("HOME")) / ".cache/hadatrain/tokens");
  if (old) ::setenv("HADATRAIN_CACHE", saved.c_str(), 1);
  else ::unsetenv("HADATRAIN_CACHE");
}
