// The token store: plain-text documents (one file = one document) tokenised once into a memory-mapped token
// file with an index of document boundaries, kept in a cache folder and reused while the source files and the
// tokenizer are unchanged (Note [Token cache] in text_store.cpp).
//
//   TokenStoreOptions o;
//   o.sources = {"/data/sotu"};                    // files, folders (searched recursively) or glob patterns
//   auto store = TokenStore::open(o, *tokenizer);  // tokenises on first use, maps the cache afterwards
//   store->copy_tokens(store->document_begin(3), 10, out);  // the first 10 tokens of document 3
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/data/tokenizer.h"

namespace ht::data {

// ${HADATRAIN_CACHE}/tokens, or $HOME/.cache/hadatrain/tokens when HADATRAIN_CACHE is unset or empty.
std::filesystem::path default_token_cache_dir();

// The text files `sources` name, in a deterministic order: each source is a file (taken whatever its
// extension), a folder (its files whose extension is in `extensions`, recursively, sorted by path; an empty
// `extensions` takes every file) or a glob pattern (its matches, sorted; folders among them are searched as
// above). Sources keep their order; a file named twice is kept at its first place. Throws ht::Error naming
// the source when it does not exist, a pattern matches nothing, or a folder holds no matching file.
std::vector<std::filesystem::path> list_text_files(const std::vector<std::string>& sources,
                                                   const std::vector<std::string>& extensions);

struct TokenStoreOptions {
  std::vector<std::string> sources;           // see list_text_files
  std::vector<std::string> extensions{".txt"};
  std::filesystem::path cache_dir;            // empty: default_token_cache_dir()
  int num_threads = 0;                        // tokenisation threads; 0: one per hardware thread (at most 16)
};

// Whether open() found a valid cache or tokenised the sources.
enum class CacheUse { reused, built };

class TokenStore {
 public:
  // Finds the cache of (the files of opts.sources, tok) in the cache folder and maps it when it is valid; else
  // tokenises every file (in parallel over files, through Tokenizer::encode, which must be safe to call
  // concurrently) and writes the cache atomically first. A token id outside [0, tok.vocab_size()) is an
  // ht::Error naming the file, the id and the vocabulary size.
  static std::shared_ptr<const TokenStore> open(const TokenStoreOptions& opts, const Tokenizer& tok);

  ~TokenStore();
  TokenStore(const TokenStore&) = delete;
  TokenStore& operator=(const TokenStore&) = delete;

  int64_t num_documents() const { return static_cast<int64_t>(files_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  // Document d is tokens [document_begin(d), document_begin(d) + document_size(d)) of the store.
  int64_t document_begin(int64_t d) const;
  int64_t document_size(int64_t d) const;
  // The largest token id of document d (-1 for an empty document).
  int64_t document_max_id(int64_t d) const;
  const std::filesystem::path& document_file(int64_t d) const;

  int64_t token(int64_t i) const;
  // Tokens [begin, begin + n) widened to int64 into out[0, n).
  void copy_tokens(int64_t begin, int64_t n, int64_t* out) const;

  // The vocabulary size of the tokenizer the store was made with; 2 (u16) or 4 (u32) bytes per token.
  int64_t vocab_size() const { return vocab_size_; }
  int token_bytes() const { return token_bytes_; }
  const std::filesystem::path& cache_file() const { return cache_file_; }
  CacheUse cache_use() const { return cache_use_; }
  // A digest of the tokenizer (its kind, fingerprint and vocabulary size) and every source file's size and CRC-32
  // in order: equal for the same texts tokenised by the same tokenizer, wherever the files lie and whatever their
  // modification times (the cache key also covers paths and times).
  uint64_t content_digest() const { return content_digest_; }

  struct Mapping;  // the mapped cache file (text_store.cpp)

 private:
  TokenStore() = default;
  std::vector<std::filesystem::path> files_;
  std::unique_ptr<Mapping> map_;
  const unsigned char* tokens_ = nullptr;  // num_tokens_ * token_bytes_ bytes, in the mapping
  const uint64_t* offsets_ = nullptr;      // num_documents() + 1 entries
  const uint32_t* max_ids_ = nullptr;      // num_documents() entries, 0xffffffff for an empty document
  int64_t num_tokens_ = 0;
  int64_t vocab_size_ = 0;
  int token_bytes_ = 4;
  std::filesystem::path cache_file_;
  CacheUse cache_use_ = CacheUse::reused;
  uint64_t content_digest_ = 0;
};

}  // namespace ht::data
