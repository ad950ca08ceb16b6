// Language-model datasets from TextDataOptions: the token store and packing for text, the JSONL reader for
// chat, and the validation split.
#include "hadatrain/data/text_data.h"

#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"

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
      const DocumentSplit s = split_documents(store->num_documents(), o.val_fraction, seed);
      ds.train = std::make_shared<const PackedTextDataset>(store, s.train, pack);
      ds.val = std::make_shared<const PackedTextDataset>(store, s.val, pack);
      logging::info("text data: {} documents, {} for validation (val_fraction {})", store->num_documents(),
                    s.val.size(), o.val_fraction);
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
