// Checks between keys that the config alone decides, made when it is read, so that the error names the file, line
// and key (and the other key with its line): checkpoint.sharded outside fsdp, the data keys that depend on the
// dataset's images, data against model, a llama preset's shape, and the two warm-up lengths.
#include <string>
#include <utility>
#include <vector>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
using ht::test::error_of;

namespace {

std::pair<TrainerConfig, std::vector<std::string>> read_with_notes(const std::string& yaml,
                                                                   const std::vector<std::string>& overrides = {}) {
  ConfigReader root = ConfigReader::from_string(yaml, "c.yaml", overrides);
  TrainerConfig c = read_trainer_config(root);
  return {c, root.notes()};
}

TrainerConfig read(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return read_with_notes(yaml, overrides).first;
}

std::string error_reading(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { read(yaml, overrides); });
}

bool holds(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::string kText = "data:\n  dataset: text\n  paths: [a]\n  tokenizer: t\n";  // 4 lines, no seq_len

}  // namespace

TEST_CASE("checkpoint.sharded is fsdp's: another value than true under another mode is an error", "[config]") {
  CHECK(error_reading("checkpoint:\n  sharded: false\ndist:\n  mode: ddp\n") ==
        "c.yaml:2:12: checkpoint.sharded: applies to dist.mode fsdp only (no other mode writes shards), got mode ddp");
  CHECK(error_reading("checkpoint:\n  every_steps: 5\n  sharded: false\n") ==
        "c.yaml:3:12: checkpoint.sharded: applies to dist.mode fsdp only (no other mode writes shards), got mode none");
  CHECK(error_reading("", {"checkpoint.sharded=false"}) ==
        "--set checkpoint.sharded=false: checkpoint.sharded: applies to dist.mode fsdp only (no other mode writes "
        "shards), got mode none");
  // true, which a saved config.yaml records, passes and is not recorded again.
  const TrainerConfig ddp = read("checkpoint:\n  sharded: true\ndist:\n  mode: ddp\n");
  CHECK(ddp.dist.mode == dist::DistMode::ddp);
  CHECK_FALSE(holds(ddp.resolved_yaml, "sharded"));
  // Under fsdp it is read, and stays the checkpoint section's last key, before grad_pipeline and dist.
  const TrainerConfig fsdp = read("checkpoint:\n  sharded: false\n  keep_last: 3\ndist:\n  mode: fsdp\n");
  CHECK_FALSE(fsdp.checkpoint.sharded);
  CHECK(fsdp.checkpoint.keep_last == 3);
  CHECK(holds(fsdp.resolved_yaml, "  on_save_failure: stop\n  sharded: false\ngrad_pipeline:\n"));
  CHECK(fsdp.resolved_yaml.find("checkpoint:") < fsdp.resolved_yaml.find("dist:"));
  CHECK(read(fsdp.resolved_yaml).resolved_yaml == fsdp.resolved_yaml);
  CHECK(read("dist:\n  mode: fsdp\n").checkpoint.sharded);
}

TEST_CASE("--set dist.mode away from fsdp drops the file's checkpoint.sharded with a note", "[config]") {
  const std::string fsdp = "checkpoint:\n  every_steps: 10\n  sharded: false\ndist:\n  mode: fsdp\n  prefetch: false\n";
  const auto [c, notes] = read_with_notes(fsdp, {"dist.mode=ddp"});
  CHECK(c.dist.mode == dist::DistMode::ddp);
  CHECK(c.checkpoint.sharded);
  CHECK(c.checkpoint.every_steps == 10);
  CHECK_FALSE(holds(c.resolved_yaml, "sharded"));
  REQUIRE(notes.size() == 2);
  CHECK(notes[0] == "--set dist.mode=ddp: dropped the file's checkpoint.sharded (c.yaml:3:3): it applies to the file's "
                    "own dist.mode settings only");
  CHECK_THAT(notes[1], HasSubstr("dropped the file's dist.prefetch (c.yaml:6:3)"));
  // A --set that keeps fsdp keeps the file's value.
  CHECK_FALSE(read(fsdp, {"dist.timeout_s=10"}).checkpoint.sharded);
  // One that makes the key apply is no switch away from it.
  CHECK_FALSE(read("checkpoint:\n  sharded: false\n", {"dist.mode=fsdp"}).checkpoint.sharded);
}

TEST_CASE("data keys that depend on the dataset's images are checked when the config is read", "[config]") {
  const std::string folder = "data:\n  dataset: image_folder\n  root: /x\n";
  CHECK(error_reading(folder + "  augment: none\n") ==
        "c.yaml:4:12: data.augment: none cannot be used with image_folder: its images differ in size, and a batch "
        "needs them cropped to one (use imagenet, the default)");
  CHECK(read(folder + "  augment: imagenet\n").data.augment == AugmentKind::imagenet);
  // Normalisation: one value, or one per channel (1 for MNIST-layout files, 3 for the others).
  CHECK(error_reading("data:\n  dataset: cifar10\n  root: /x\n  normalize:\n    mean: [0.5, 0.5]\n    std: [0.2, 0.2]\n") ==
        "c.yaml:5:11: data.normalize.mean: expected one value, or one per channel of the cifar10 images (3), got 2");
  CHECK(error_reading("data:\n  normalize:\n    mean: [0.5, 0.5, 0.5]\n    std: [0.2, 0.2, 0.2]\n") ==
        "c.yaml:3:11: data.normalize.mean: expected one value, or one per channel of the fashion_mnist images (1), "
        "got 3");
  CHECK(read(folder + "  normalize:\n    mean: [0.5]\n    std: [0.25]\n").data.normalize_std == std::vector<double>{0.25});
  // RandAugment's fill: the same rule.
  CHECK(error_reading(folder + "  rand_augment:\n    fill: [124, 116]\n") ==
        "c.yaml:5:11: data.rand_augment.fill: expected one value, or one per channel (3), got 2");
  CHECK(error_reading("data:\n  rand_augment:\n    fill: [1, 2, 3]\n") ==
        "c.yaml:3:11: data.rand_augment.fill: expected one value, or one per channel (1), got 3");
  CHECK(read(folder + "  rand_augment:\n    fill: [124, 116, 104]\n").data.rand_augment->warp.fill.size() == 3);
  // A language-model run needs validation text.
  CHECK(error_reading(kText + "  val_fraction: 0\nmodel:\n  name: llama\n") ==
        "c.yaml:5:17: data.val_fraction: a language-model run needs validation text: give a share in (0, 1) here, or "
        "data.val_paths");
  CHECK(read(kText + "  val_paths: [b]\n  seq_len: 16\nmodel:\n  name: llama\n").data.text.val_paths.size() == 1);
}

TEST_CASE("the data and the model are checked against each other when the config is read", "[config]") {
  // llama trains on text or chat, the other models on images: the error names model.name and data.dataset's line.
  CHECK(error_reading("data:\n  dataset: mnist\n  root: /x\nmodel:\n  name: llama\n") ==
        "c.yaml:5:9: model.name: data.dataset mnist (c.yaml:2:12) and model.name llama do not go together: a language "
        "model (llama) trains on text or chat data, the other models on images");
  CHECK(holds(error_reading("model:\n  name: llama\n"),
              "c.yaml:2:9: model.name: data.dataset fashion_mnist (the default) and model.name llama do not go"));
  CHECK(holds(error_reading(kText + "model:\n  name: vit\n"),
              "c.yaml:6:9: model.name: data.dataset text (c.yaml:2:12) and model.name vit do not go together"));
  CHECK(holds(error_reading(kText, {"model.name=resnet18"}),
              "--set model.name=resnet18: model.name: data.dataset text (c.yaml:2:12) and model.name resnet18"));
  // data.seq_len fits a preset's positions (tiny: 256).
  const std::string llama = "model:\n  name: llama\n";
  CHECK(error_reading(kText + "  seq_len: 300\n" + llama) ==
        "c.yaml:5:12: data.seq_len: 300 is longer than the model's max_position_embeddings 256 (model.preset tiny's)");
  CHECK(error_reading(kText + "  seq_len: 200\n" + llama + "  llama:\n    max_position_embeddings: 128\n") ==
        "c.yaml:5:12: data.seq_len: 200 is longer than the model's max_position_embeddings 128 "
        "(model.llama.max_position_embeddings, c.yaml:9:30)");
  CHECK(read(kText + "  seq_len: 256\n" + llama).data.text.seq_len == 256);
  // With init_from the architecture comes from the source's files, which the run reads.
  CHECK(read(kText + "  seq_len: 300\n" + llama + "  init_from: some/hf\n").model.init_from == "some/hf");
}

TEST_CASE("data.seq_len defaults to the preset's positions, at most 512, and the resolved config records it",
          "[config]") {
  const std::string llama = "model:\n  name: llama\n";
  const TrainerConfig tiny = read(kText + llama);  // tiny: 256 positions
  CHECK(tiny.data.text.seq_len == 256);
  CHECK(holds(tiny.resolved_yaml, "\n  seq_len: 256\n"));
  CHECK(read(kText + llama + "  llama:\n    max_position_embeddings: 100\n").data.text.seq_len == 100);
  CHECK(read(kText + llama, {"model.llama.max_position_embeddings=40"}).data.text.seq_len == 40);
  CHECK(read(kText + llama + "  preset: sotu_small\n").data.text.seq_len == 512);
  CHECK(read(kText + llama + "  preset: llama32_1b\n").data.text.seq_len == 512);  // 131072 positions
  // The saved config gives the value, and reads back to it whatever the model's positions become.
  const TrainerConfig again = read(tiny.resolved_yaml, {"model.llama.max_position_embeddings=300"});
  CHECK(again.data.text.seq_len == 256);
  // With init_from the source's positions decide it when the run starts (set_default_seq_len): 0 until then, and
  // not in the resolved config.
  TrainerConfig from = read(kText + llama + "  init_from: some/hf\n");
  CHECK(from.data.text.seq_len == 0);
  CHECK(!holds(from.resolved_yaml, "seq_len"));
  const std::string before = from.resolved_yaml;
  set_default_seq_len(from, 2048);
  CHECK(from.data.text.seq_len == 512);
  // The resolved config gains the key, and its other values stay.
  YAML::Node after = YAML::Load(from.resolved_yaml);
  CHECK(after["data"]["seq_len"].as<int64_t>() == 512);
  after["data"].remove("seq_len");
  CHECK(YAML::Dump(after) == YAML::Dump(YAML::Load(before)));
}

TEST_CASE("a llama preset's shape overrides are checked when the config is read", "[config]") {
  const std::string llama = kText + "  seq_len: 16\nmodel:\n  name: llama\n  llama:\n";  // the llama keys from line 9
  CHECK(error_reading(llama + "    num_key_value_heads: 3\n") ==
        "c.yaml:9:26: model.llama.num_key_value_heads: num_attention_heads 4 is not a multiple of num_key_value_heads 3");
  // The key the config gives is the one named: hidden_size here (the preset gave the 4 heads) ...
  CHECK(error_reading(llama + "    hidden_size: 66\n") ==
        "c.yaml:9:18: model.llama.hidden_size: hidden_size 66 is not a multiple of num_attention_heads 4 (with head_dim "
        "0 the head dim is hidden_size / num_attention_heads)");
  // ... and the heads when both are given.
  CHECK(error_reading(llama + "    hidden_size: 60\n    num_attention_heads: 4\n") ==
        "c.yaml:10:26: model.llama.num_attention_heads: the head dim 15 (hidden_size / num_attention_heads) must be "
        "even: rotary embeddings turn pairs of its values");
  CHECK(error_reading(llama + "    head_dim: 7\n") ==
        "c.yaml:9:15: model.llama.head_dim: the head dim 7 must be even: rotary embeddings turn pairs of its values");
  const TrainerConfig ok = read(llama + "    hidden_size: 60\n    num_attention_heads: 6\n    num_key_value_heads: 3\n");
  CHECK(ok.model.llama.resolved_head_dim() == 10);
}

TEST_CASE("warmup_steps with warmup_epochs names both keys and where each is given", "[config]") {
  CHECK(error_reading("schedule:\n  warmup_epochs: 2\n  warmup_steps: 100\n") ==
        "c.yaml:3:17: schedule.warmup_steps: give warmup_steps or warmup_epochs, not both: schedule.warmup_epochs "
        "(c.yaml:2:18) is 2 as well; remove one of them or set it to 0");
  CHECK(error_reading("schedule:\n  warmup_steps: 100\n", {"schedule.warmup_epochs=0.5"}) ==
        "c.yaml:2:17: schedule.warmup_steps: give warmup_steps or warmup_epochs, not both: schedule.warmup_epochs "
        "(--set schedule.warmup_epochs=0.5) is 0.5 as well; remove one of them or set it to 0");
  CHECK(read("schedule:\n  warmup_epochs: 2\n  warmup_steps: 0\n").schedule.warmup_epochs == 2.0);
  CHECK(read("schedule:\n  warmup_epochs: 2\n", {"schedule.warmup_epochs=0", "schedule.warmup_steps=50"})
            .schedule.warmup_steps == 50);
}
