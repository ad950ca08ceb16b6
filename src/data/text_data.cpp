// Language-model datasets from TextDataOptions: the token store and packing for text, the JSONL reader for
// chat, and the validation split.
#include "hadatrain/data/text_data.h"

#include <tuple>

#include <fmt/ranges.h>

#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/core/name_list.h"

namespace ht::data {

TextSubset::TextSubset(std::shared_ptr<const TextDataset> base, std::vector<int64_t> rows)
    : base_(std::move(base)), rows_(std::move(rows)) {
  HT_CHECK(base_ != nullptr, "TextSubset: no dataset");
  for (int64_t r : rows_) HT_CHECK(r >= 0 && r < base_->size(), "TextSubset: row {} is outside [0, {})", r, base_->size());
}

void TextSubset::get(int64_t i, int64_t* input_ids, int64_t* labels) const {
  HT_CHECK(i >= 0 && i < size(), "TextSubset: row {} is outside [0, {})", i, size());
  base_->get(rows_[static_cast<std::size_t>(i)], input_ids, labels);
}

uint64_t TextSubset::digest() const {
  return Fnv1a().add("subset\n").add_value(base_->digest()).add_values(rows_).value();
}

std::string TextSubset::describe(int64_t i) const {
  if (i < 0 || i >= size()) return fmt::format("row {} (out of range)", i);
  return base_->describe(rows_[static_cast<std::size_t>(i)]);
}

namespace {

std::vector<std::string> extensions_of(const TextDataOptions& o) {
  if (!o.extensions.empty()) return o.extensions;
  return {o.kind == TextKind::chat ? ".jsonl" : ".txt"};
}

std::shared_ptr<const TokenStore> open_store(const TextDataOptions& o, const std::vector<std::string>& sources,
                                             const Tokenizer& tok) {
  TokenStoreOptions so;
  so.sources = sources;
  so.extensions = extensions_of(o);
  so.cache_dir = o.cache_dir;
  so.num_threads = o.num_threads;
  return TokenStore::open(so, tok);
}

std::shared_ptr<const TextDataset> open_chat(const TextDataOptions& o, const std::vector<std::string>& sources,
                                             const Tokenizer& tok) {
  ChatDataOptions co;
  co.seq_len = o.seq_len;
  co.layout = o.layout;
  if (!o.chat_format.empty()) co.format = parse_chat_format(o.chat_format);
  co.num_threads = o.num_threads;
  return std::make_shared<const ChatDataset>(list_text_files(sources, extensions_of(o)), tok, co);
}

std::string plural(std::size_t n, const char* word) { return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s"); }

// The files of `docs`, the first three named.
std::string files_of(const TokenStore& store, const std::vector<int64_t>& docs) {
  std::vector<std::string> files;
  for (int64_t d : docs) files.push_back(store.document_file(d).string());
  return first_names(files, 3);
}

// Note [Splitting documents with text]
// data.val_fraction holds out whole documents. A document whose file gives no token (an empty file, or one the
// tokenizer turns into nothing) adds nothing to the packed stream (Note [Packing]), so the split is drawn among
// the documents with tokens only:
// otherwise a seed could draw empty documents alone for validation and leave it without a single row. The
// documents with tokens are split as split_documents(n, val_fraction, seed) splits 0..n-1, so a corpus without
// empty files splits as it always did. A side that still holds less than one row (short documents) is an
// error naming its files, its token count, and the settings that change it.
DocumentSplit split_documents_with_text(const TokenStore& store, const TextDataOptions& o, const PackOptions& pack,
                                        uint64_t seed) {
  std::vector<int64_t> with_text;
  for (int64_t d = 0; d < store.num_documents(); ++d)
    if (store.document_size(d) > 0) with_text.push_back(d);
  const std::size_t empty = static_cast<std::size_t>(store.num_documents()) - with_text.size();
  HT_CHECK(with_text.size() >= 2,
           "text data: data.val_fraction {} holds out whole documents, but {} holds {} with tokens ({}, {} of them "
           "empty); give validation files in data.val_paths",
           o.val_fraction, fmt::join(o.paths, ", "), plural(with_text.size(), "document"),
           plural(static_cast<std::size_t>(store.num_documents()), "file"), empty);
  const DocumentSplit s = split_documents(static_cast<int64_t>(with_text.size()), o.val_fraction, seed);
  DocumentSplit out;
  for (int64_t i : s.train) out.train.push_back(with_text[static_cast<std::size_t>(i)]);
  for (int64_t i : s.val) out.val.push_back(with_text[static_cast<std::size_t>(i)]);
  for (const auto& [side, docs, fix] :
       {std::tuple{"training", &out.train, "lower data.val_fraction, use more text or lower data.seq_len"},
        std::tuple{"validation", &out.val, "raise data.val_fraction, give data.val_paths or lower data.seq_len"}}) {
    const int64_t tokens = packed_stream_size(store, *docs, pack);
    HT_CHECK(tokens > o.seq_len,
             "text data: the {} split holds {} ({}) of {} tokens with BOS/EOS, fewer than one row of data.seq_len + 1 "
             "= {}: data.val_fraction {} of the {} with tokens in {} (chosen by run.seed {}); {}",
             side, plural(docs->size(), "document"), files_of(store, *docs), tokens, o.seq_len + 1, o.val_fraction,
             plural(with_text.size(), "document"), fmt::join(o.paths, ", "), seed, fix);
  }
  return out;
}

}  // namespace

TextDatasets make_text_datasets(const TextDataOptions& o, const Tokenizer& tok, uint64_t seed) {
  HT_CHECK(!o.paths.empty(), "text data: no paths given (data.paths: files, folders or glob patterns)");
  HT_CHECK(o.seq_len >= 2, "text data: seq_len must be >= 2, got {}", o.seq_len);
  const bool split = o.val_paths.empty() && o.val_fraction > 0.0;
  TextDatasets ds;
  if (o.kind == TextKind::text) {
    const PackOptions pack = pack_options(tok, o.seq_len);
    auto store = open_store(o, o.paths, tok);
    if (split) {
      const DocumentSplit s = split_documents_with_text(*store, o, pack, seed);
      ds.train = std::make_shared<const PackedTextDataset>(store, s.train, pack);
      ds.val = std::make_shared<const PackedTextDataset>(store, s.val, pack);
      const std::size_t empty = static_cast<std::size_t>(store->num_documents()) - s.train.size() - s.val.size();
      logging::info("text data: {} documents{}, {} for validation (val_fraction {})", store->num_documents(),
                    empty ? fmt::format(" ({} empty, left out)", empty) : std::string(), s.val.size(), o.val_fraction);
    } else {
      ds.train = std::make_shared<const PackedTextDataset>(store, pack);
      if (!o.val_paths.empty())
        ds.val = std::make_shared<const PackedTextDataset>(open_store(o, o.val_paths, tok), pack);
    }
  } else {
    auto all = open_chat(o, o.paths, tok);
    if (split) {
      const DocumentSplit s = split_documents(all->size(), o.val_fraction, seed);
      ds.train = std::make_shared<const TextSubset>(all, s.train);
      ds.val = std::make_shared<const TextSubset>(all, s.val);
    } else {
      ds.train = all;
      if (!o.val_paths.empty()) ds.val = open_chat(o, o.val_paths, tok);
    }
  }
  logging::info("text data: {} training rows of {} tokens{}", ds.train->size(), o.seq_len,
                ds.val ? fmt::format(", {} validation rows", ds.val->size()) : std::string());
  return ds;
}

}  // namespace ht::data
