// Chat / instruction JSONL: line parsing and its errors (file and line named), the loss on assistant responses
// only (labels -100 elsewhere), padding with EOS, truncation, packing and the vocabulary check.
#include <filesystem>

#include "hadatrain/core/error.h"
#include "hadatrain/data/text_chat.h"
#include "hadatrain/data/text_data.h"
#include "hadatrain/data/text_loader.h"
#include "support/catch.h"
#include "test_text_support.h"

using namespace ht;
using namespace ht::data;
using text_test::ByteTokenizer;
namespace fs = std::filesystem;

namespace {

constexpr int64_t X = kIgnoreIndex, EOT = 260;

std::vector<int64_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// The llama3 rendering of one user/assistant turn with the byte tokenizer.
std::vector<int64_t> llama3_ids(const std::string& user, const std::string& answer) {
  std::vector<int64_t> ids{256, 258};
  for (auto part : {bytes("user"), std::vector<int64_t>{259}, bytes("\n\n" + user), std::vector<int64_t>{EOT, 258},
                    bytes("assistant"), std::vector<int64_t>{259}, bytes("\n\n" + answer), std::vector<int64_t>{EOT}})
    ids.insert(ids.end(), part.begin(), part.end());
  return ids;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> row(const TextDataset& ds, int64_t i) {
  std::vector<int64_t> in(static_cast<std::size_t>(ds.seq_len())), lab(in.size());
  ds.get(i, in.data(), lab.data());
  return {in, lab};
}

fs::path jsonl(const std::string& name, const std::string& text) {
  const fs::path p = text_test::scratch() / name;
  text_test::write_text(p, text);
  return p;
}

}  // namespace

TEST_CASE("parse_chat_line: messages and the instruction form; bad lines name where they are", "[text]") {
  const auto m = parse_chat_line(R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}]})", "f:1");
  REQUIRE(m.size() == 2);
  CHECK(m[1].role == "assistant");
  CHECK(m[1].content == "Yo");
  const auto a = parse_chat_line(R"({"instruction":"Add","input":"1 2","output":"3"})", "f:2");
  REQUIRE(a.size() == 2);
  CHECK(a[0].content == "Add\n\n1 2");
  CHECK(a[1].content == "3");
  CHECK(parse_chat_line(R"({"instruction":"Say hi","output":"hi"})", "f:3")[0].content == "Say hi");

  CHECK_THROWS_WITH(parse_chat_line("{\"messages\": [", "data.jsonl:7"), HasSubstr("data.jsonl:7: not valid JSON"));
  CHECK_THROWS_WITH(parse_chat_line("[1]", "d:1"), HasSubstr("d:1: expected a JSON object"));
  CHECK_THROWS_WITH(parse_chat_line(R"({"messages":[{"role":"user"}]})", "d:2"),
                    HasSubstr("d:2: messages[0]: the example has no \"content\""));
  CHECK_THROWS_WITH(parse_chat_line(R"({"messages":[{"role":"user","content":"x"}]})", "d:3"), HasSubstr("no assistant message"));
  CHECK_THROWS_WITH(parse_chat_line(R"({"instruction":"x","output":3})", "d:4"), HasSubstr("\"output\" must be a string"));
  CHECK_THROWS_WITH(parse_chat_line(R"({"text":"x"})", "d:5"), HasSubstr("d:5: expected {\"messages\""));
}

TEST_CASE("ChatDataset pad: labels only on response tokens, padding with EOS after the example", "[text]") {
  ByteTokenizer tok;
  CHECK(pad_id(tok) == 257);
  const fs::path f = jsonl("pad.jsonl", R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}]})"
                                        "\n\n"
                                        R"({"instruction":"Q","output":"A"})"
                                        "\n");
  const std::vector<int64_t> ids = llama3_ids("Hi", "Yo");
  REQUIRE(ids.size() == 28);
  ChatDataset ds({f}, tok, {.seq_len = 32});
  REQUIRE(ds.size() == 2);
  const auto [in, lab] = row(ds, 0);
  for (int64_t t = 0; t < 32; ++t) {
    INFO("t = " << t);
    CHECK(in[static_cast<std::size_t>(t)] == (t < 28 ? ids[static_cast<std::size_t>(t)] : 257));
    // next-token labels: 'Y' 'o' <|eot_id|> are the response (ids 25, 26, 27), predicted from t = 24, 25, 26
    const int64_t want = t == 24 ? 'Y' : t == 25 ? 'o' : t == 26 ? EOT : X;
    CHECK(lab[static_cast<std::size_t>(t)] == want);
  }
  CHECK_THAT(ds.describe(1), HasSubstr("pad.jsonl:3"));  // the blank line is skipped, the line number kept
  const auto [in1, lab1] = row(ds, 1);
  const std::vector<int64_t> qa = llama3_ids("Q", "A");
  REQUIRE(qa.size() == 26);
  CHECK(std::vector<int64_t>(in1.begin(), in1.begin() + 26) == qa);
  CHECK(in1[26] == 257);

  // The same through the loader in the Hugging Face layout: labels[t] = the response token at t.
  TextLoader loader(std::make_shared<const ChatDataset>(std::vector<fs::path>{f}, tok, ChatDataOptions{.seq_len = 32}),
                    {.batch_size = 1, .labels = LabelLayout::same_position, .shuffle = Shuffle::off});
  const auto hf = loader.next()->at(batch_key::labels).to_vector<int64_t>();
  for (int64_t t = 0; t < 32; ++t) CHECK(hf[static_cast<std::size_t>(t)] == (t >= 25 && t <= 27 ? ids[static_cast<std::size_t>(t)] : X));
}

TEST_CASE("ChatDataset pad: long examples are truncated; examples without a response in the window are left out", "[text]") {
  ByteTokenizer tok;
  const fs::path f = jsonl("trunc.jsonl", R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}]})"
                                          "\n"
                                          R"({"messages":[{"role":"user","content":"a much longer question"},{"role":"assistant","content":"ok"}]})"
                                          "\n");
  ChatDataset ds({f}, tok, {.seq_len = 26});  // the first example's 28 tokens are cut to 27: 'Y' and 'o' stay
  CHECK(ds.num_truncated() == 2);
  REQUIRE(ds.size() == 1);
  const auto [in, lab] = row(ds, 0);
  CHECK(lab[24] == 'Y');
  CHECK(lab[25] == 'o');
  CHECK_THROWS_WITH(ChatDataset({f}, tok, {.seq_len = 10}), HasSubstr("no example of"));
}

TEST_CASE("ChatDataset pack: examples concatenated into windows, response labels kept across the seams", "[text]") {
  ByteTokenizer tok;
  std::string lines;
  for (int i = 0; i < 6; ++i)
    lines += fmt::format(R"({{"messages":[{{"role":"user","content":"q{}"}},{{"role":"assistant","content":"a{}"}}]}})", i, i) + "\n";
  const fs::path f = jsonl("pack.jsonl", lines);
  ChatDataset ds({f}, tok, {.seq_len = 16, .layout = ChatLayout::pack});
  std::vector<int64_t> stream, response;
  for (int i = 0; i < 6; ++i) {
    const auto ids = llama3_ids(fmt::format("q{}", i), fmt::format("a{}", i));
    stream.insert(stream.end(), ids.begin(), ids.end());
    for (std::size_t k = 0; k < ids.size(); ++k) response.push_back(k + 3 >= ids.size() ? 1 : 0);  // "aN" + eot
  }
  // The rows are the windows with a response token among their labels (stream positions w*16 + 1 ... w*16 + 16);
  // the others lie inside prompts and are left out.
  const std::size_t windows = (stream.size() - 1) / 16;
  std::vector<std::size_t> kept;
  for (std::size_t w = 0; w < windows; ++w)
    if (std::find(response.begin() + w * 16 + 1, response.begin() + w * 16 + 17, int64_t{1}) != response.begin() + w * 16 + 17)
      kept.push_back(w);
  REQUIRE(kept.size() < windows);  // the examples (28 tokens, the last 3 the response) leave prompt-only windows
  REQUIRE(ds.size() == static_cast<int64_t>(kept.size()));
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto [in, lab] = row(ds, i);
    const std::size_t w = kept[static_cast<std::size_t>(i)];
    CHECK_THAT(ds.describe(i), HasSubstr(fmt::format("window {} ", w)));
    bool counted = false;
    for (std::size_t t = 0; t < 16; ++t) {
      const std::size_t s = w * 16 + t;
      CHECK(in[t] == stream[s]);
      CHECK(lab[t] == (response[s + 1] ? stream[s + 1] : X));
      counted = counted || lab[t] != X;
    }
    CHECK(counted);
  }
  // One example whose response ("a" and the end of turn, its last two tokens) lies after the last whole window:
  // no row, an error naming the file.
  std::size_t n = 200;
  while ((llama3_ids(std::string(n, 'q'), "a").size() - 1) % 16 < 2) ++n;
  const fs::path prompts = jsonl("prompts.jsonl", std::string(R"({"messages":[{"role":"user","content":")") +
                                                      std::string(n, 'q') + R"("},{"role":"assistant","content":"a"}]})" "\n");
  CHECK_THROWS_WITH(ChatDataset({prompts}, tok, {.seq_len = 16, .layout = ChatLayout::pack}),
                    HasSubstr("no packed window of " + prompts.string() + " holds a response token"));
}

TEST_CASE("ChatDataset: a bad line names the file and the line; ids beyond the model's vocabulary are an error", "[text]") {
  ByteTokenizer tok;
  const fs::path bad = jsonl("bad.jsonl", R"({"instruction":"Q","output":"A"})"
                                          "\n"
                                          R"({"instruction":"Q","output":"A"})"
                                          "\n"
                                          R"({"instruction":"Q" "output":"A"})"
                                          "\n");
  CHECK_THROWS_WITH(ChatDataset({bad}, tok, {.seq_len = 32}), HasSubstr("bad.jsonl:3: not valid JSON"));

  const fs::path ok = jsonl("ok.jsonl", R"({"instruction":"Q","output":"\u00ff"})"
                                        "\n");
  ChatDataset ds({ok}, tok, {.seq_len = 32});
  CHECK_NOTHROW(ds.check_vocab(261, "model.vocab_size"));
  CHECK_THROWS_WITH(ds.check_vocab(258, "model.vocab_size"), HasSubstr("ok.jsonl:1: token id 258 is >= model.vocab_size 258"));
}

TEST_CASE("make_text_datasets chat: a held-out share of the examples", "[text]") {
  ByteTokenizer tok;
  std::string lines;
  for (int i = 0; i < 10; ++i) lines += fmt::format(R"({{"instruction":"q{}","output":"a{}"}})", i, i) + "\n";
  jsonl("chatdir/train.jsonl", lines);
  TextDataOptions o;
  o.kind = TextKind::chat;
  o.paths = {(text_test::scratch() / "chatdir").string()};
  o.seq_len = 40;
  o.val_fraction = 0.2;
  const TextDatasets ds = make_text_datasets(o, tok, 5);
  REQUIRE(ds.val);
  CHECK(ds.train->size() == 8);
  CHECK(ds.val->size() == 2);
  CHECK_THAT(ds.val->describe(0), HasSubstr("train.jsonl:"));
}
