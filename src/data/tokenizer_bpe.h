// The parts of the byte-level BPE engine (src/data/tokenizer_bpe*.cpp): the pre-tokenisation regex
// (PCRE2), the GPT-2 byte <-> unicode mapping, and the merge table with the merge loop.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ht::data::detail {

// A compiled PCRE2 pattern (UTF + Unicode properties, JIT where available) that splits text the way a
// tokenizer.json `Split` pre-tokenizer with behavior "Isolated" does: every match is a piece, and so is
// every stretch of text between matches.
class SplitRegex {
 public:
  // `literal`: the pattern is a plain string ({"String": ...}) rather than a regex ({"Regex": ...}).
  // `where` names the file and key for error messages.
  SplitRegex(const std::string& pattern, bool literal, const std::string& where);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Appends the pieces of `text` (views into it, in order, covering it) to `out`. Throws ht::Error when
  // `text` is not valid UTF-8, naming the byte offset.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The GPT-2 byte-level alphabet: byte b <-> one printable code point (b itself for the printable Latin-1
// bytes, 256 + k for the k-th other byte), as UTF-8.
const std::string& byte_to_unicode(uint8_t b);
// The byte that `symbol` (one code point, UTF-8) stands for, or -1 when it is not in the alphabet.
int unicode_to_byte(std::string_view symbol);

// Merge ranks: (left id, right id) -> (rank, merged id). The lowest rank merges first.
class MergeTable {
 public:
  void add(int32_t left, int32_t right, int32_t rank, int32_t merged);
  size_t size() const { return table_.size(); }
  // Applies the merges to `symbols` in rank order (leftmost first among equal ranks) until none applies;
  // `symbols` is replaced by the result.
  void apply(std::vector<int32_t>& symbols) const;

 private:
  struct Entry {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t key(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  const Entry* find(int32_t l, int32_t r) const {
    auto it = table_.find(key(l, r));
    return it == table_.end() ? nullptr : &it->second;
  }
  std::unordered_map<uint64_t, Entry> table_;
};

}  // namespace ht::data::detail
