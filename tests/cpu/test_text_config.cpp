// The data keys of language-model configs (data.dataset text | chat): what they fill in DataSection::text,
// their defaults, and the errors for a missing or misplaced key.
#include "hadatrain/core/config_reader.h"
#include "hadatrain/train/trainer_config.h"
#include "support/catch.h"

using namespace ht;
using namespace ht::train;

namespace {

TrainerConfig read(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return read_trainer_config(ConfigReader::from_string(yaml, "lm.yaml", overrides));
}

}  // namespace

TEST_CASE("config: data.dataset text fills the text options", "[text]") {
  const TrainerConfig c = read(R"(
data:
  dataset: text
  paths: [sotu/, extra.txt]
  tokenizer: llama2/tokenizer.model
  seq_len: 256
  val_fraction: 0.1
  cache_dir: /tmp/tok
  batch_size: 16
model:
  name: llama
)");
  CHECK(c.data.dataset == DatasetKind::text);
  const data::TextDataOptions& t = c.data.text;
  CHECK(t.kind == data::TextKind::text);
  CHECK(t.paths == std::vector<std::string>{"sotu/", "extra.txt"});
  CHECK(t.tokenizer == "llama2/tokenizer.model");
  CHECK(t.seq_len == 256);
  CHECK(t.val_fraction == 0.1);
  CHECK(t.val_paths.empty());
  CHECK(t.cache_dir == "/tmp/tok");
  CHECK(t.extensions == std::vector<std::string>{".txt"});
  CHECK(c.data.batch_size == 16);
  CHECK(c.data.eval_batch_size == 8);
  CHECK(dataset_name(c.data.dataset) == "text");
}

TEST_CASE("config: data.dataset chat with its layout and chat format; val_paths replace val_fraction", "[text]") {
  const TrainerConfig c = read(R"(
data:
  dataset: chat
  paths: [train.jsonl]
  val_paths: [val.jsonl]
  tokenizer: llama3/
  layout: pack
  chat_format: llama3
model:
  name: llama
  preset: sotu_small
)");
  const data::TextDataOptions& t = c.data.text;
  CHECK(t.kind == data::TextKind::chat);
  CHECK(t.layout == data::ChatLayout::pack);
  CHECK(t.chat_format == "llama3");
  CHECK(t.val_paths == std::vector<std::string>{"val.jsonl"});
  CHECK(t.val_fraction == 0.0);
  CHECK(t.extensions == std::vector<std::string>{".jsonl"});
  CHECK(t.seq_len == 512);
  CHECK(read("data: {dataset: chat, paths: [a.jsonl], tokenizer: t, seq_len: 64}\nmodel: {name: llama}")
            .data.text.chat_format.empty());  // auto
}

TEST_CASE("config: text data errors name the key", "[text]") {
  CHECK_THROWS_WITH(read("data: {dataset: text, tokenizer: t}"), HasSubstr("data.paths"));
  CHECK_THROWS_WITH(read("data: {dataset: text, paths: [a]}"), HasSubstr("data.tokenizer"));
  CHECK_THROWS_WITH(read("data: {dataset: text, paths: [a], tokenizer: t, seq_len: 1}"), HasSubstr("data.seq_len"));
  CHECK_THROWS_WITH(read("data: {dataset: text, paths: [a], tokenizer: t, val_fraction: 1.0}"), HasSubstr("data.val_fraction"));
  // Image keys do not apply to text data, and chat keys not to plain text.
  CHECK_THROWS_WITH(read("data: {dataset: text, paths: [a], tokenizer: t, root: /x}"), HasSubstr("data.root"));
  CHECK_THROWS_WITH(read("data: {dataset: text, paths: [a], tokenizer: t, layout: pack}"), HasSubstr("data.layout"));
  CHECK_THROWS_WITH(read("data: {dataset: chat, paths: [a], tokenizer: t, layout: stack}"), HasSubstr("data.layout"));
  // Both ways of choosing the validation text at once.
  CHECK_THROWS_WITH(read("data: {dataset: text, paths: [a], val_paths: [b], val_fraction: 0.1, tokenizer: t}"),
                    HasSubstr("data.val_fraction") && HasSubstr("does not apply with data.val_paths"));
  // Image-model keys that a llama has no use for are errors, not ignored.
  const std::string text = "data: {dataset: text, paths: [a], tokenizer: t}\n";
  CHECK_THROWS_WITH(read(text + "model: {name: llama, num_classes: 10}"),
                    HasSubstr("model.num_classes") && HasSubstr("does not apply to llama"));
  CHECK_THROWS_WITH(read(text + "model: {name: llama, init_from: x, init_from_reset: [lm_head.*]}"),
                    HasSubstr("model.init_from_reset") && HasSubstr("does not apply to llama"));
}
