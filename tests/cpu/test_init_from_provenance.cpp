// What an image run started from model.init_from records (train/provenance.h, init_from_record): a .safetensors file
// (as timm and torchvision ship weights) by its size and SHA-256, a folder of weights by each file's, one of our
// checkpoints by its step folder and its own record nested, so a chain of image runs stays traceable as an LM's does;
// and the record names the step whose weights were loaded even when the root's `latest` moves while the run starts
// (Note [model.init_from resolved once] in trainer_setup.cpp). The runs are a small MLP on 8x8 MNIST-layout images:
// make_model reads model.init_from the same way for every image model (ResNet, ViT, MLP).
#include "support/catch.h"
#include "support/testing.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hadatrain/core/digest.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/provenance.h"
#include "hadatrain/train/trainer.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using test::read_text;
std::string abs(const fs::path& p) { return fs::absolute(p).lexically_normal().string(); }

io::Metadata metadata_of(const fs::path& checkpoint) {
  return io::read_safetensors_header(checkpoint / "model.safetensors").metadata;
}
json record_of(const fs::path& checkpoint) { return json::parse(metadata_of(checkpoint).at(kInitFromKey)); }

const fs::path& work() {
  static const fs::path w = test::scratch_dir() / "image_provenance";
  return w;
}

// An MLP run on the 8x8 images (4 steps per epoch), a checkpoint every step, all kept.
TrainerConfig image_run(const std::string& name, std::vector<std::string> sets = {}) {
  static const std::string config = [] {
    const fs::path p = work() / "image_run.yaml";
    fs::create_directories(work());
    std::ofstream(p) << fmt::format(
        "run:\n  seed: 3\n"
        "data:\n  dataset: mnist\n  root: {}\n  batch_size: 16\n  eval_batch_size: 16\n  num_workers: 0\n"
        "model:\n  name: mlp\n  hidden: [16]\n"
        "train:\n  epochs: 1\n  log_every: 1\n"
        "checkpoint:\n  every_steps: 1\n  keep_last: 0\n",
        test::idx8_dataset().string());
    return p.string();
  }();
  sets.push_back("run.out_dir=" + (work() / name).string());
  return load_trainer_config(config, sets);
}

fs::path checkpoints_of(const TrainerConfig& c) { return fs::path(c.run.out_dir) / "checkpoints"; }

// A from-scratch run's root: step_1 and step_2, latest at step_2.
const fs::path& scratch_root() {
  static const fs::path root = [] {
    const TrainerConfig c = image_run("scratch", {"train.max_steps=2"});
    run_training(c);
    return checkpoints_of(c);
  }();
  return root;
}

}  // namespace

TEST_CASE("an image run from a .safetensors file or a folder of weights records each file's size and SHA-256",
          "[init_from_provenance]") {
  // The scratch run's step-2 weights as a hub would ship them: one file, and a folder holding model.safetensors.
  const io::SafetensorsContents w = io::load_safetensors(scratch_root() / "step_2" / "model.safetensors");
  const fs::path file = work() / "weights.safetensors";
  io::save_safetensors(file, io::TensorList(w.tensors.begin(), w.tensors.end()), {{"format", "pt"}});
  const std::string sha = Sha256().add(read_text(file)).hex();

  const TrainerConfig a = image_run("from_file", {"train.max_steps=1", "model.init_from=" + file.string()});
  run_training(a);
  const json r = record_of(checkpoints_of(a) / "step_1");
  CHECK(r == json{{"model.init_from", file.string()},
                  {"kind", "file"},
                  {"file", abs(file)},
                  {"bytes", fs::file_size(file)},
                  {"sha256", sha}});
  CHECK(provenance_lines(metadata_of(checkpoints_of(a) / "step_1")) ==
        std::vector<std::string>{fmt::format("trained from the file {} ({} bytes, SHA-256 {})", abs(file),
                                             fs::file_size(file), sha)});
  // A resume carries the record on and does not read model.init_from, which may be gone by then.
  const uintmax_t bytes = fs::file_size(file);
  const fs::path moved = work() / "weights_moved.safetensors";
  fs::rename(file, moved);
  run_training(image_run("from_file", {"train.max_steps=2", "model.init_from=" + file.string()}),
               {.kind = ResumeFrom::Kind::latest});
  CHECK(record_of(checkpoints_of(a) / "step_2") == r);
  fs::rename(moved, file);
  CHECK(fs::file_size(file) == bytes);

  const fs::path folder = work() / "hub_folder";
  fs::create_directories(folder);
  fs::copy_file(file, folder / "model.safetensors", fs::copy_options::overwrite_existing);
  const TrainerConfig b = image_run("from_folder", {"train.max_steps=1", "model.init_from=" + folder.string()});
  run_training(b);
  const json rb = record_of(checkpoints_of(b) / "step_1");
  CHECK(rb["kind"] == "folder");
  CHECK(rb["folder"] == abs(folder));
  CHECK(rb["files"] == json::array({{{"name", "model.safetensors"}, {"bytes", fs::file_size(file)}, {"sha256", sha}}}));
  CHECK(provenance_lines(metadata_of(checkpoints_of(b) / "step_1")).front() ==
        fmt::format("trained from the folder {} (1 file(s), each with its SHA-256)", abs(folder)));

  // A run from scratch records nothing.
  CHECK(metadata_of(scratch_root() / "step_2").count(kInitFromKey) == 0);
}

TEST_CASE("an image run from one of our checkpoints records the step loaded, even when the root's latest moves while "
          "the run starts, and the chain of runs stays traceable",
          "[init_from_provenance]") {
  const fs::path root = scratch_root();
  // Another run moves latest back to step_1 the moment the weights are loaded, before the record is made (the seam
  // is the report line naming what was loaded).
  const TrainerConfig a = image_run("from_root", {"train.max_steps=2", "model.init_from=" + root.string()});
  std::string loaded;
  {
    test::LogCapture log(2, [&](const std::string& message) {
      if (!message.starts_with("model.init_from ") || !loaded.empty()) return;
      loaded = message;
      std::ofstream(root / "latest", std::ios::binary) << "step_1\n";
    });
    run_training(a);
  }
  INFO(loaded);
  CHECK(loaded.starts_with(fmt::format("model.init_from {}: ", (root / "step_2").string())));
  CHECK(read_text(root / "latest").starts_with("step_1"));  // the seam ran
  const json r = record_of(checkpoints_of(a) / "step_2");
  CHECK(r == json{{"model.init_from", root.string()}, {"kind", "checkpoint"}, {"folder", abs(root / "step_2")},
                  {"step", 2}});
  CHECK(record_of(checkpoints_of(a) / "step_1") == r);

  // A run from that run's checkpoint nests its record; inspect-checkpoint's line of descent names both steps.
  const fs::path a_step = checkpoints_of(a) / "step_2";
  const TrainerConfig b = image_run("from_run", {"train.max_steps=1", "model.init_from=" + a_step.string()});
  run_training(b);
  CHECK(record_of(checkpoints_of(b) / "step_1") ==
        json{{"model.init_from", a_step.string()}, {"kind", "checkpoint"}, {"folder", abs(a_step)}, {"step", 2},
             {"init_from", r}});
  CHECK(provenance_lines(metadata_of(checkpoints_of(b) / "step_1")) ==
        std::vector<std::string>{fmt::format("trained from the checkpoint {} (step 2)", abs(a_step)),
                                 fmt::format("which was trained from the checkpoint {} (step 2)", abs(root / "step_2"))});

  // A source checkpoint whose record is not JSON is named with its file and key.
  const fs::path garbled = work() / "garbled";
  fs::remove_all(garbled);
  fs::copy(a_step, garbled, fs::copy_options::recursive);
  io::SafetensorsContents m = io::load_safetensors(garbled / "model.safetensors");
  m.metadata[kInitFromKey] = "[1, 2";
  io::save_safetensors(garbled / "model.safetensors", io::TensorList(m.tensors.begin(), m.tensors.end()), m.metadata);
  CHECK_THAT(test::error_of([&] {
               run_training(image_run("from_garbled", {"train.max_steps=1", "model.init_from=" + garbled.string()}));
             }),
             HasSubstr((garbled / "model.safetensors").string() + ": the metadata \"hadatrain.init_from\""));
}
