// Causal-LM windows over a token store (packing with BOS/EOS) and the deterministic validation split.
#include "hadatrain/data/text_dataset.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"
#include "hadatrain/data/sample_rng.h"

namespace ht::data {

// Note [Packing]
// The stream is the chosen documents in order, each as a segment [BOS] tokens [EOS] (BOS/EOS only when the
// tokenizer has them); empty documents have no segment. Window i is stream tokens [i*T, i*T + T + 1): the
// model reads the first T and is scored on the last T, so every stream token after the first is a label
// exactly once per epoch and consecutive windows share one token. A window may span several documents:
// attention is not masked at document boundaries (the BOS/EOS tokens tell the model where one ends), as in
// GPT-2 / llm.c pre-training. Segment starts are kept as prefix sums, so finding the segment of a position is
// a binary search and a window is filled by copying at most a few slices of the mapped token file.

PackOptions pack_options(const Tokenizer& tok, int64_t seq_len) {
  PackOptions o;
  o.seq_len = seq_len;
  o.bos = tok.bos_id();
  o.eos = tok.eos_id();
  return o;
}

int64_t packed_stream_size(const TokenStore& store, const std::vector<int64_t>& documents, const PackOptions& opts) {
  const int64_t extra = (opts.bos ? 1 : 0) + (opts.eos ? 1 : 0);
  int64_t total = 0;
  for (int64_t d : documents) {
    const int64_t n = store.document_size(d);
    total += n == 0 ? 0 : n + extra;
  }
  return total;
}

PackedTextDataset::PackedTextDataset(std::shared_ptr<const TokenStore> store, PackOptions opts)
    : PackedTextDataset(store, [&] {
        std::vector<int64_t> all(static_cast<std::size_t>(store ? store->num_documents() : 0));
        std::iota(all.begin(), all.end(), int64_t{0});
        return all;
      }(), opts) {}

PackedTextDataset::PackedTextDataset(std::shared_ptr<const TokenStore> store, std::vector<int64_t> documents,
                                     PackOptions opts)
    : store_(std::move(store)), opts_(opts) {
  HT_CHECK(store_ != nullptr, "PackedTextDataset: no token store");
  HT_CHECK(opts_.seq_len >= 1, "text data: seq_len must be >= 1, got {}", opts_.seq_len);
  const int64_t extra = (opts_.bos ? 1 : 0) + (opts_.eos ? 1 : 0);
  starts_.push_back(0);
  for (int64_t d : documents) {
    const int64_t n = store_->document_size(d);
    if (n == 0) continue;
    docs_.push_back(d);
    starts_.push_back(starts_.back() + n + extra);
  }
  const int64_t total = starts_.back();
  windows_ = total > opts_.seq_len ? (total - 1) / opts_.seq_len : 0;
  HT_CHECK(windows_ > 0,
           "text data: the {} document(s) hold {} tokens with BOS/EOS, fewer than one window of seq_len + 1 = {} "
           "(first file: {}); use more text or a smaller seq_len",
           documents.size(), total, opts_.seq_len + 1,
           documents.empty() ? std::string("none") : store_->document_file(documents.front()).string());
}

std::size_t PackedTextDataset::segment_of(int64_t pos) const {
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), pos);
  return static_cast<std::size_t>(it - starts_.begin()) - 1;
}

void PackedTextDataset::copy_stream(int64_t begin, int64_t n, int64_t* out) const {
  HT_CHECK(begin >= 0 && n >= 0 && begin + n <= stream_size(), "packed text: stream tokens [{}, {}) are outside [0, {})",
           begin, begin + n, stream_size());
  std::size_t s = segment_of(begin);
  int64_t off = begin - starts_[s];  // position within segment s
  while (n > 0) {
    const int64_t d = docs_[s];
    const int64_t len = store_->document_size(d);
    const int64_t lead = opts_.bos ? 1 : 0;
    if (off < lead) {  // BOS
      *out++ = *opts_.bos;
      --n, ++off;
      continue;
    }
    if (off < lead + len) {  // document tokens
      const int64_t k = std::min(n, lead + len - off);
      store_->copy_tokens(store_->document_begin(d) + (off - lead), k, out);
      out += k, n -= k, off += k;
      continue;
    }
    if (opts_.eos && off == lead + len) {  // EOS
      *out++ = *opts_.eos;
      --n, ++off;
      continue;
    }
    ++s, off = 0;  // next segment
  }
}

void PackedTextDataset::get(int64_t i, int64_t* input_ids, int64_t* labels) const {
  HT_CHECK(i >= 0 && i < windows_, "packed text: window {} is outside [0, {})", i, windows_);
  const int64_t T = opts_.seq_len;
  std::vector<int64_t> w(static_cast<std::size_t>(T + 1));  // (T+1)
  copy_stream(i * T, T + 1, w.data());
  std::copy(w.begin(), w.begin() + T, input_ids);
  std::copy(w.begin() + 1, w.end(), labels);
}

std::string PackedTextDataset::describe(int64_t i) const {
  const int64_t pos = i * opts_.seq_len;
  if (i < 0 || i >= windows_) return fmt::format("window {} (out of range)", i);
  const std::size_t s = segment_of(pos);
  return fmt::format("window {} (stream tokens {}..{}, starting in {})", i, pos, pos + opts_.seq_len,
                     store_->document_file(docs_[s]).string());
}

void PackedTextDataset::check_vocab(int64_t vocab_size, const std::string& whose) const {
  for (const auto& [name, id] : {std::pair{"BOS", opts_.bos}, std::pair{"EOS", opts_.eos}})
    HT_CHECK(!id || *id < vocab_size, "text data: the tokenizer's {} id {} is >= {} {}", name, *id, whose, vocab_size);
  for (int64_t d : docs_) {
    const int64_t mx = store_->document_max_id(d);
    if (mx < vocab_size) continue;
    const int64_t b = store_->document_begin(d), n = store_->document_size(d);
    int64_t at = 0;
    while (at < n && store_->token(b + at) < vocab_size) ++at;
    HT_FAIL("{}: token id {} (token {} of the file) is >= {} {}: the model's vocabulary is smaller than the "
            "tokenizer's ({})",
            store_->document_file(d).string(), mx, at, whose, vocab_size, store_->vocab_size());
  }
}

uint64_t PackedTextDataset::digest() const {
  Fnv1a h;
  h.add("packed text\n").add_value(store_->content_digest()).add_values(docs_).add_value(opts_.seq_len);
  for (const auto& id : {opts_.bos, opts_.eos}) h.add_value(id ? int64_t{*id} : int64_t{-1});
  return h.value();
}

DocumentSplit split_documents(int64_t n, double val_fraction, uint64_t seed) {
  HT_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "text data: val_fraction must be in [0, 1), got {}", val_fraction);
  DocumentSplit out;
  int64_t k = static_cast<int64_t>(std::llround(val_fraction * static_cast<double>(n)));
  if (val_fraction > 0.0) {
    HT_CHECK(n >= 2,
             "text data: val_fraction {} needs at least 2 documents to hold some out, the corpus has {}; give "
             "separate validation paths instead",
             val_fraction, n);
    k = std::clamp<int64_t>(k, 1, n - 1);
  }
  std::vector<int64_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  SampleRng rng(seed, data_stream(RngPurpose::split, 0, 0));
  for (int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
  }
  std::vector<char> is_val(static_cast<std::size_t>(n), 0);
  for (int64_t i = 0; i < k; ++i) is_val[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = 1;
  for (int64_t d = 0; d < n; ++d) (is_val[static_cast<std::size_t>(d)] ? out.val : out.train).push_back(d);
  return out;
}

}  // namespace ht::data
