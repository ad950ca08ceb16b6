// Causal-LM text data: packing (exact tokens, BOS/EOS placement, windows overlapping by one), the label
// layouts, the validation split, per-epoch permutations, exact resume mid-epoch, make_text_datasets and the
// vocabulary check.
#include <algorithm>
#include <filesystem>
#include <set>

#include "hadatrain/core/error.h"
#include "hadatrain/data/text_data.h"
#include "hadatrain/data/text_loader.h"
#include "support/catch.h"
#include "test_text_support.h"

using namespace ht;
using namespace ht::data;
using text_test::ByteTokenizer;
using text_test::ByteTokenizerOptions;
namespace fs = std::filesystem;

namespace {

constexpr int64_t BOS = 256, EOS = 257, X = kIgnoreIndex;

std::shared_ptr<const TokenStore> store_of(const std::string& name, const std::vector<std::string>& docs,
                                           const ByteTokenizer& tok) {
  const fs::path d = text_test::scratch() / name;
  for (std::size_t i = 0; i < docs.size(); ++i) text_test::write_text(d / fmt::format("d{:03d}.txt", i), docs[i]);
  TokenStoreOptions o;
  o.sources = {d.string()};
  o.cache_dir = text_test::scratch() / "cache";
  return TokenStore::open(o, tok);
}

std::vector<int64_t> row(const TextDataset& ds, int64_t i, bool labels) {
  std::vector<int64_t> in(static_cast<std::size_t>(ds.seq_len())), lab(in.size());
  ds.get(i, in.data(), lab.data());
  return labels ? lab : in;
}

std::vector<int64_t> v(std::initializer_list<int64_t> l) { return l; }

// Every batch of `epochs` epochs from `pos` on, as (position, input_ids, labels) flattened.
std::vector<std::vector<int64_t>> drain(TextLoader& loader, int64_t until_epoch) {
  std::vector<std::vector<int64_t>> out;
  while (loader.position().epoch < until_epoch) {
    auto b = loader.next();
    if (!b) continue;
    std::vector<int64_t> rec{b->position.epoch, b->position.batch};
    for (auto key : {batch_key::input_ids, batch_key::labels}) {
      const auto t = b->at(key).to_vector<int64_t>();
      rec.insert(rec.end(), t.begin(), t.end());
    }
    out.push_back(std::move(rec));
  }
  return out;
}

}  // namespace

TEST_CASE("PackedTextDataset: BOS before and EOS after every document, windows of T+1 overlapping by one", "[text]") {
  ByteTokenizer tok;
  auto store = store_of("pack", {"ab", "", "cde"}, tok);  // the empty document gets no BOS/EOS
  PackedTextDataset ds(store, pack_options(tok, 4));
  // stream: BOS a b EOS BOS c d e EOS (9 tokens) -> (9 - 1) / 4 = 2 windows
  REQUIRE(ds.stream_size() == 9);
  REQUIRE(ds.size() == 2);
  CHECK(row(ds, 0, false) == v({BOS, 'a', 'b', EOS}));
  CHECK(row(ds, 0, true) == v({'a', 'b', EOS, BOS}));
  CHECK(row(ds, 1, false) == v({BOS, 'c', 'd', 'e'}));
  CHECK(row(ds, 1, true) == v({'c', 'd', 'e', EOS}));
  CHECK_THAT(ds.describe(1), HasSubstr("d002.txt"));

  ByteTokenizer no_bos({.bos = false});
  auto s2 = store_of("pack_nobos", {"ab", "cde"}, no_bos);
  PackedTextDataset d2(s2, pack_options(no_bos, 3));  // a b EOS c d e EOS -> 2 windows, one token left over
  REQUIRE(d2.size() == 2);
  CHECK(row(d2, 0, false) == v({'a', 'b', EOS}));
  CHECK(row(d2, 1, false) == v({'c', 'd', 'e'}));
  CHECK(row(d2, 1, true) == v({'d', 'e', EOS}));

  // A subset of documents packs only those, in the order given.
  PackedTextDataset d3(store, {2}, pack_options(tok, 4));
  REQUIRE(d3.size() == 1);
  CHECK(row(d3, 0, false) == v({BOS, 'c', 'd', 'e'}));

  CHECK_THROWS_WITH(PackedTextDataset(store, pack_options(tok, 9)), HasSubstr("fewer than one window of seq_len + 1 = 10"));
}

TEST_CASE("TextLoader: input_ids and labels in both label layouts", "[text]") {
  ByteTokenizer tok;
  auto ds = std::make_shared<const PackedTextDataset>(store_of("layout", {"ab", "cde"}, tok), pack_options(tok, 4));
  TextLoader next(ds, {.batch_size = 2, .shuffle = Shuffle::off});  // next_token is the default
  auto b = next.next();
  REQUIRE(b);
  CHECK(b->at(batch_key::input_ids).shape() == Shape{2, 4});
  CHECK(b->at(batch_key::input_ids).dtype() == DType::i64);
  CHECK(b->at(batch_key::labels).to_vector<int64_t>() == v({'a', 'b', EOS, BOS, 'c', 'd', 'e', EOS}));

  TextLoader hf(ds, {.batch_size = 2, .labels = LabelLayout::same_position, .shuffle = Shuffle::off});
  auto h = hf.next();
  REQUIRE(h);
  CHECK(h->at(batch_key::input_ids).to_vector<int64_t>() == v({BOS, 'a', 'b', EOS, BOS, 'c', 'd', 'e'}));
  CHECK(h->at(batch_key::labels).to_vector<int64_t>() == v({X, 'a', 'b', EOS, X, 'c', 'd', 'e'}));

  // Page-locked batches (an ordinary CPU tensor without a CUDA device) hold the same values.
  TextLoader pinned(ds, {.batch_size = 2, .labels = LabelLayout::same_position, .shuffle = Shuffle::off, .pin_memory = true,
                         .pin_device = Device::cuda(0)});
  auto p = pinned.next();
  REQUIRE(p);
  CHECK(p->at(batch_key::input_ids).to_vector<int64_t>() == h->at(batch_key::input_ids).to_vector<int64_t>());
  CHECK(p->at(batch_key::labels).to_vector<int64_t>() == h->at(batch_key::labels).to_vector<int64_t>());
}

TEST_CASE("split_documents: deterministic, disjoint, the requested share", "[text]") {
  const DocumentSplit a = split_documents(40, 0.1, 7), b = split_documents(40, 0.1, 7), c = split_documents(40, 0.1, 8);
  CHECK(a.val.size() == 4);
  CHECK(a.train.size() == 36);
  CHECK(a.val == b.val);
  CHECK(a.val != c.val);
  std::set<int64_t> all(a.train.begin(), a.train.end());
  all.insert(a.val.begin(), a.val.end());
  CHECK(all.size() == 40);
  CHECK(split_documents(3, 0.01, 0).val.size() == 1);  // at least one
  CHECK(split_documents(3, 0.0, 0).val.empty());
  CHECK_THROWS_WITH(split_documents(1, 0.5, 0), HasSubstr("separate validation paths"));
}

TEST_CASE("TextLoader: each epoch a seeded permutation, the same in every run, exact resume mid-epoch", "[text]") {
  ByteTokenizer tok;
  std::vector<std::string> docs;
  for (int i = 0; i < 12; ++i) docs.push_back(std::string(static_cast<std::size_t>(5 + i % 4), static_cast<char>('a' + i)));
  auto ds = std::make_shared<const PackedTextDataset>(store_of("resume", docs, tok), pack_options(tok, 5));
  REQUIRE(ds->size() >= 15);
  const TextLoaderOptions o{.batch_size = 4, .seed = 11};

  TextLoader full(ds, o);
  const auto run = drain(full, 3);
  TextLoader again(ds, o);
  CHECK(drain(again, 3) == run);

  // Each epoch visits every row once, in a different order per epoch.
  TextLoader l(ds, o);
  std::vector<std::vector<int64_t>> orders(3);
  while (l.position().epoch < 3) {
    const int64_t e = l.position().epoch;
    if (auto b = l.next()) orders[static_cast<std::size_t>(e)].insert(orders[static_cast<std::size_t>(e)].end(), b->indices.begin(), b->indices.end());
  }
  for (const auto& ord : orders) {
    CHECK(static_cast<int64_t>(ord.size()) == ds->size());
    CHECK(static_cast<int64_t>(std::set<int64_t>(ord.begin(), ord.end()).size()) == ds->size());
  }
  CHECK(orders[0] != orders[1]);

  // Resuming at any step of the run gives exactly the batches the uninterrupted run gave from there.
  const int64_t per_epoch = full.batches_per_epoch();
  for (int64_t k : {int64_t{1}, per_epoch - 1, per_epoch + 2}) {
    TextLoader resumed(ds, o, {k / per_epoch, k % per_epoch});
    const auto rest = drain(resumed, 3);
    REQUIRE(rest.size() == run.size() - static_cast<std::size_t>(k));
    CHECK(std::equal(rest.begin(), rest.end(), run.begin() + k));
  }
  // seek() on a used loader does the same.
  TextLoader s(ds, o);
  s.next();
  s.seek({1, 2});
  const auto after_seek = drain(s, 3);
  CHECK(std::equal(after_seek.begin(), after_seek.end(), run.begin() + per_epoch + 2));
}

TEST_CASE("TextLoader: drop_last and the last partial batch", "[text]") {
  ByteTokenizer tok;
  auto ds = std::make_shared<const PackedTextDataset>(store_of("partial", {std::string(40, 'x')}, tok), pack_options(tok, 4));
  REQUIRE(ds->size() == 10);  // 42 tokens with BOS/EOS -> 41 / 4
  TextLoader keep(ds, {.batch_size = 4});
  CHECK(keep.batches_per_epoch() == 3);
  keep.seek({0, 2});
  CHECK(keep.next()->size() == 2);
  CHECK_FALSE(keep.next());
  TextLoader drop(ds, {.batch_size = 4, .drop_last = DropLast::yes});
  CHECK(drop.batches_per_epoch() == 2);
  CHECK_THROWS_WITH(TextLoader(ds, {.batch_size = 11, .drop_last = DropLast::yes}),
                    HasSubstr("10 rows of seq_len 4 in batches of 11 give no batch") &&
                        HasSubstr("(drop_last keeps full batches only)"));
  // min_last_batch (data-parallel runs: the world size) drops a last batch of fewer rows.
  TextLoader three(ds, {.batch_size = 4, .min_last_batch = 3});
  CHECK(three.batches_per_epoch() == 2);
  CHECK(TextLoader(ds, {.batch_size = 4, .min_last_batch = 2}).batches_per_epoch() == 3);
}

TEST_CASE("check_vocab: a token id beyond the model's vocabulary names the file, the id and the size", "[text]") {
  ByteTokenizer tok;
  auto store = store_of("vocab", {"abc", "ok \xff tail"}, tok);
  PackedTextDataset ds(store, pack_options(tok, 4));
  CHECK_NOTHROW(ds.check_vocab(261, "model.vocab_size"));
  CHECK_THROWS_WITH(ds.check_vocab(256, "model.vocab_size"), HasSubstr("BOS id 256 is >= model.vocab_size 256"));
  ByteTokenizer plain({.bos = false, .eos = false});
  PackedTextDataset d2(store_of("vocab_plain", {"abc", "ok \xff tail"}, plain), pack_options(plain, 4));
  CHECK_NOTHROW(d2.check_vocab(256, "model.vocab_size"));
  CHECK_THROWS_WITH(d2.check_vocab(200, "model.vocab_size"), HasSubstr("d001.txt: token id 255 (token 3 of the file) is >= model.vocab_size 200"));
}

TEST_CASE("make_text_datasets: a held-out share of documents, or separate validation paths", "[text]") {
  const fs::path d = text_test::scratch() / "make";
  for (int i = 0; i < 20; ++i) text_test::write_text(d / "train" / fmt::format("{:02d}.txt", i), std::string(30, static_cast<char>('a' + i)));
  text_test::write_text(d / "val" / "v.txt", std::string(50, 'V'));
  ByteTokenizer tok;
  TextDataOptions o;
  o.paths = {(d / "train").string()};
  o.seq_len = 8;
  o.cache_dir = (text_test::scratch() / "cache").string();
  o.val_fraction = 0.1;
  const TextDatasets a = make_text_datasets(o, tok, 3);
  REQUIRE(a.val);
  const auto& tr = dynamic_cast<const PackedTextDataset&>(*a.train);
  const auto& va = dynamic_cast<const PackedTextDataset&>(*a.val);
  CHECK(va.documents().size() == 2);
  CHECK(tr.documents().size() == 18);
  CHECK(va.documents() == split_documents(20, 0.1, 3).val);

  o.val_paths = {(d / "val").string()};
  const TextDatasets b = make_text_datasets(o, tok, 3);
  CHECK(dynamic_cast<const PackedTextDataset&>(*b.train).documents().size() == 20);
  CHECK(row(*b.val, 0, false) == v({BOS, 'V', 'V', 'V', 'V', 'V', 'V', 'V'}));

  o.val_paths.clear();
  o.val_fraction = 0.0;
  CHECK_FALSE(make_text_datasets(o, tok, 3).val);
}

TEST_CASE("make_text_datasets: empty documents are left out of the split, for every seed", "[text]") {
  // 10 documents, 4 of them empty (d01, d04, d05, d08): a held-out share of 0.1 is one document with text.
  const fs::path d = text_test::scratch() / "empty_docs";
  for (int i = 0; i < 10; ++i)
    text_test::write_text(d / fmt::format("d{:02d}.txt", i), i == 1 || i == 4 || i == 5 || i == 8 ? std::string()
                                                                 : std::string(20, static_cast<char>('a' + i)));
  ByteTokenizer tok;
  TextDataOptions o;
  o.paths = {d.string()};
  o.seq_len = 8;
  o.cache_dir = (text_test::scratch() / "cache").string();
  o.val_fraction = 0.1;
  const std::vector<int64_t> with_text{0, 2, 3, 6, 7, 9};
  for (uint64_t seed = 0; seed < 24; ++seed) {
    INFO("seed " << seed);
    const TextDatasets ds = make_text_datasets(o, tok, seed);
    const auto& va = dynamic_cast<const PackedTextDataset&>(*ds.val);
    const auto& tr = dynamic_cast<const PackedTextDataset&>(*ds.train);
    REQUIRE(va.documents().size() == 1);
    CHECK(std::find(with_text.begin(), with_text.end(), va.documents()[0]) != with_text.end());
    CHECK(tr.documents().size() == 5);
    CHECK(va.size() == 2);  // 22 tokens with BOS/EOS: (22 - 1) / 8 rows
    // The split is the one split_documents makes over the 6 documents with text.
    CHECK(va.documents()[0] == with_text[static_cast<std::size_t>(split_documents(6, 0.1, seed).val[0])]);
  }
}

TEST_CASE("make_text_datasets: a validation split too small for a row names the files, the counts and the settings",
          "[text]") {
  ByteTokenizer tok;
  TextDataOptions o;
  o.seq_len = 8;
  o.cache_dir = (text_test::scratch() / "cache").string();
  o.val_fraction = 0.2;
  // One document with text among three: nothing to hold out.
  const fs::path one = text_test::scratch() / "one_with_text";
  text_test::write_text(one / "a.txt", "");
  text_test::write_text(one / "b.txt", std::string(40, 'b'));
  text_test::write_text(one / "c.txt", "");
  o.paths = {one.string()};
  CHECK_THROWS_WITH(make_text_datasets(o, tok, 0),
                    HasSubstr("text data: data.val_fraction 0.2 holds out whole documents, but " + one.string() +
                              " holds 1 document with tokens (3 files, 2 of them empty)") &&
                        HasSubstr("data.val_paths"));
  // Five documents with text, one of them 2 bytes long: the seeds that hold it out leave a validation split of
  // 4 tokens with BOS/EOS, fewer than one row of 9.
  const fs::path shortdoc = text_test::scratch() / "short_doc";
  for (int i = 0; i < 5; ++i)
    text_test::write_text(shortdoc / fmt::format("d{}.txt", i), i == 3 ? std::string("xy") : std::string(30, 'a'));
  o.paths = {shortdoc.string()};
  int failed = 0;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    if (split_documents(5, 0.2, seed).val != std::vector<int64_t>{3}) {
      CHECK_NOTHROW(make_text_datasets(o, tok, seed));
      continue;
    }
    ++failed;
    CHECK_THROWS_WITH(make_text_datasets(o, tok, seed),
                      HasSubstr("text data: the validation split holds 1 document (" + (shortdoc / "d3.txt").string() +
                                ") of 4 tokens with BOS/EOS, fewer than one row of data.seq_len + 1 = 9") &&
                          HasSubstr(fmt::format("data.val_fraction 0.2 of the 5 documents with tokens in {} (chosen "
                                                "by run.seed {})", shortdoc.string(), seed)) &&
                          HasSubstr("raise data.val_fraction, give data.val_paths or lower data.seq_len"));
  }
  CHECK(failed > 0);
}
