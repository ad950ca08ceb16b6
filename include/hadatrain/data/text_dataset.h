// Token-sequence datasets for language models: a finite, indexable set of fixed-length rows, each an input
// sequence and its next-token labels. PackedTextDataset packs the documents of a token store into windows
// for causal-LM pre-training (Note [Packing] in text_dataset.cpp); ChatDataset (text_chat.h) holds
// instruction / chat examples with the loss on responses only. TextLoader (text_loader.h) batches them.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hadatrain/data/text_store.h"

namespace ht::data {

// The label of a position that carries no loss (PyTorch's cross-entropy ignore_index).
inline constexpr int64_t kIgnoreIndex = -100;

class TextDataset {
 public:
  virtual ~TextDataset() = default;
  virtual int64_t size() const = 0;     // rows
  virtual int64_t seq_len() const = 0;  // T: tokens per row
  // Row i: input_ids[0, T) and labels[0, T), labels[t] the token that follows input t, or kIgnoreIndex where
  // there is no loss. Thread-safe.
  virtual void get(int64_t i, int64_t* input_ids, int64_t* labels) const = 0;
  // Where row i comes from, for error messages ("window 17: tokens 8704.. of .../1790_washington.txt").
  virtual std::string describe(int64_t i) const = 0;
  // Throws ht::Error naming the source file, the id and `vocab_size` when a token id the rows can hold is
  // >= vocab_size (a model with a smaller vocabulary than the tokenizer); `whose` names the vocabulary
  // ("model.vocab_size").
  virtual void check_vocab(int64_t vocab_size, const std::string& whose) const = 0;
  // A digest of the rows: equal digests mean the same rows (the same tokens and labels in the same order), as far
  // as a 64-bit digest tells (core/digest.h). A checkpoint records the training rows' digest, and --resume
  // refuses data that changed since (the loader's position would name other rows).
  virtual uint64_t digest() const = 0;
};

struct PackOptions {
  int64_t seq_len = 512;
  std::optional<int32_t> bos;  // put before every document (when the tokenizer has one)
  std::optional<int32_t> eos;  // put after every document
};

// The BOS and EOS ids of `tok` as PackOptions uses them.
PackOptions pack_options(const Tokenizer& tok, int64_t seq_len);

// The size of the stream PackedTextDataset makes of `documents`: their tokens plus a BOS and an EOS (those the
// options have) for each non-empty document. It holds (size - 1) / seq_len windows.
int64_t packed_stream_size(const TokenStore& store, const std::vector<int64_t>& documents, const PackOptions& opts);

// Documents of a token store, packed into one stream [BOS] doc [EOS] [BOS] doc [EOS] ... (empty documents
// skipped) and cut into windows of seq_len + 1 tokens that overlap by one: window i is stream tokens
// [i*T, i*T + T + 1), input = its first T tokens, labels = its last T. Trailing tokens that do not fill a
// window are dropped.
class PackedTextDataset final : public TextDataset {
 public:
  // `documents`: which documents of the store, in stream order (e.g. one side of split_documents).
  PackedTextDataset(std::shared_ptr<const TokenStore> store, std::vector<int64_t> documents, PackOptions opts);
  // Every document of the store.
  PackedTextDataset(std::shared_ptr<const TokenStore> store, PackOptions opts);

  int64_t size() const override { return windows_; }
  int64_t seq_len() const override { return opts_.seq_len; }
  void get(int64_t i, int64_t* input_ids, int64_t* labels) const override;
  std::string describe(int64_t i) const override;
  void check_vocab(int64_t vocab_size, const std::string& whose) const override;
  // The store's content digest, the documents taken, seq_len and BOS/EOS: what fixes every window.
  uint64_t digest() const override;

  int64_t stream_size() const { return starts_.back(); }
  // Stream tokens [begin, begin + n) into out.
  void copy_stream(int64_t begin, int64_t n, int64_t* out) const;
  const std::vector<int64_t>& documents() const { return docs_; }
  const TokenStore& store() const { return *store_; }

 private:
  std::size_t segment_of(int64_t stream_pos) const;
  std::shared_ptr<const TokenStore> store_;
  std::vector<int64_t> docs_;    // store document of each segment (non-empty documents only)
  std::vector<int64_t> starts_;  // stream position of each segment, then the stream size
  PackOptions opts_;
  int64_t windows_ = 0;
};

struct DocumentSplit {
  std::vector<int64_t> train, val;  // ascending document indices
};

// A deterministic split of documents 0..n-1: round(val_fraction * n) of them (at least 1 when val_fraction > 0,
// and at most n - 1) go to val, chosen by a Philox shuffle keyed by `seed` (RngPurpose::split), the rest to
// train. The same (n, val_fraction, seed) always gives the same split.
DocumentSplit split_documents(int64_t n, double val_fraction, uint64_t seed);

}  // namespace ht::data
