// Checkpoint directories: round trip, the latest/best pointers, pruning, replacement of a step, leftovers of
// interrupted saves, and errors naming the directory and the file.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "hadatrain/io/checkpoint_files.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
namespace fs = std::filesystem;
using nlohmann::json;

using ht::test::TempDir;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_raw(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// A small checkpoint whose tensors and state depend on the step.
io::CheckpointData make_data(int64_t step, bool with_optimizer = true) {
  io::CheckpointData d;
  d.step = step;
  d.model = {{"fc.weight", test::random_tensor({4, 3}, 100 + step, DType::f32)},
             {"fc.bias", test::random_tensor({4}, 200 + step, DType::bf16)},
             {"head.weight", test::random_tensor({3, 4}, 300 + step, DType::f32).transpose(0, 1)}};
  if (with_optimizer)
    d.optimizer = io::TensorList{{"fc.weight.exp_avg", test::random_tensor({4, 3}, 400 + step, DType::f32)},
                                 {"step_count", scalar_tensor(static_cast<double>(step), {DType::i64})}};
  d.state = {{"step", step},
             {"epoch", step / 10},
             {"optimizer", {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"weight_decay", 0.1}}},
             {"data_loader", {{"epoch", 1}, {"position", 12345}, {"seed", 42}}},
             {"generators", {{"dropout", {{"seed", 7}, {"offset", 1ULL << 40}}}}}};
  return d;
}

std::vector<int64_t> steps_of(const fs::path& root) { return io::list_checkpoints(root); }

}  // namespace

TEST_CASE("a checkpoint directory round-trips tensors, state and metadata", "[checkpoint]") {
  TempDir tmp("ck_roundtrip");
  const fs::path root = tmp.path / "run" / "checkpoints";  // created on demand
  const io::CheckpointData d = make_data(10);
  const fs::path dir = io::save_checkpoint(root, d);
  CHECK(dir == root / "step_10");
  CHECK(fs::is_regular_file(dir / "model.safetensors"));
  CHECK(fs::is_regular_file(dir / "optimizer.safetensors"));
  CHECK(fs::is_regular_file(dir / "state.json"));
  CHECK(read_file(root / "latest") == "step_10\n");
  CHECK_FALSE(fs::exists(root / "best"));

  const std::optional<io::Checkpoint> ck = io::load_latest_checkpoint(root);
  REQUIRE(ck.has_value());
  CHECK(ck->step == 10);
  CHECK(ck->dir == dir);
  CHECK(ck->state == d.state);
  CHECK(ck->state["generators"]["dropout"]["offset"].get<uint64_t>() == (1ULL << 40));
  REQUIRE(ck->model.tensors.size() == d.model.size());
  for (const auto& [name, t] : d.model) CHECK(same_bits(ck->model.at(name), t));
  REQUIRE(ck->optimizer.has_value());
  for (const auto& [name, t] : *d.optimizer) CHECK(same_bits(ck->optimizer->at(name), t));
  CHECK(ck->model.metadata.at("format") == "pt");
  CHECK(ck->model.metadata.at("step") == "10");

  // Without optimizer tensors there is no optimizer file; extra model metadata is kept.
  io::CheckpointData d2 = make_data(11, false);
  d2.model_metadata = {{"config", "llama-tiny"}};
  io::save_checkpoint(root, d2);
  CHECK_FALSE(fs::exists(root / "step_11" / "optimizer.safetensors"));
  const io::Checkpoint ck2 = io::load_checkpoint_dir(root / "step_11/");
  CHECK(ck2.step == 11);
  CHECK_FALSE(ck2.optimizer.has_value());
  CHECK(ck2.model.metadata.at("config") == "llama-tiny");

  // An empty optimizer list (an optimiser without state) writes a file without tensors, which loads as such.
  io::CheckpointData d3 = make_data(12, false);
  d3.optimizer = io::TensorList{};
  io::save_checkpoint(root, d3);
  const io::Checkpoint ck3 = io::load_checkpoint_dir(root / "step_12");
  REQUIRE(ck3.optimizer.has_value());
  CHECK(ck3.optimizer->tensors.empty());
}

TEST_CASE("an empty or missing root has no checkpoint", "[checkpoint]") {
  TempDir tmp("ck_empty");
  CHECK_FALSE(io::load_latest_checkpoint(tmp.path).has_value());
  CHECK_FALSE(io::latest_checkpoint_step(tmp.path / "nope").has_value());
  CHECK(io::list_checkpoints(tmp.path / "nope").empty());
  CHECK_FALSE(io::best_checkpoint_step(tmp.path).has_value());
}

TEST_CASE("latest follows saves; keep_last prunes older checkpoints but keeps the best", "[checkpoint]") {
  TempDir tmp("ck_prune");
  const fs::path root = tmp.path;
  for (int64_t s : {10, 20, 30}) io::save_checkpoint(root, make_data(s));
  CHECK(steps_of(root) == std::vector<int64_t>{10, 20, 30});
  CHECK(io::latest_checkpoint_step(root) == 30);

  io::save_checkpoint(root, make_data(40), {.keep_last = 2, .best = io::MarkBest::yes});
  CHECK(steps_of(root) == std::vector<int64_t>{30, 40});
  CHECK(read_file(root / "best") == "step_40\n");
  CHECK(io::best_checkpoint_step(root) == 40);

  // step 40 stays as the best while newer ones come and go.
  for (int64_t s : {50, 60, 70}) io::save_checkpoint(root, make_data(s), {.keep_last = 2});
  CHECK(steps_of(root) == std::vector<int64_t>{40, 60, 70});
  CHECK(io::latest_checkpoint_step(root) == 70);
  CHECK(io::best_checkpoint_step(root) == 40);
  const io::Checkpoint best = io::load_checkpoint_dir(io::checkpoint_dir(root, *io::best_checkpoint_step(root)));
  CHECK(best.state["step"] == 40);

  io::save_checkpoint(root, make_data(80), {.keep_last = 1});
  CHECK(steps_of(root) == std::vector<int64_t>{40, 80});
  // Pruning renames a checkpoint before removing it and leaves nothing of it behind.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"best", "latest", "step_40", "step_80"});
  CHECK_THROWS_WITH(io::save_checkpoint(root, make_data(90), {.keep_last = -1}), HasSubstr("keep_last"));
}

TEST_CASE("resuming from an earlier step: latest names the new save, later checkpoints are not pruned",
          "[checkpoint]") {
  TempDir tmp("ck_resume");
  const fs::path root = tmp.path;
  for (int64_t s : {10, 20, 30}) io::save_checkpoint(root, make_data(s));
  io::save_checkpoint(root, make_data(15), {.keep_last = 1});  // a run resumed from step 10
  CHECK(io::latest_checkpoint_step(root) == 15);
  CHECK(io::load_latest_checkpoint(root)->state["step"] == 15);
  CHECK(steps_of(root) == std::vector<int64_t>{15, 20, 30});  // 10 pruned; 20, 30 belong to the abandoned run
}

TEST_CASE("saving a step again replaces that checkpoint", "[checkpoint]") {
  TempDir tmp("ck_replace");
  io::save_checkpoint(tmp.path, make_data(5));
  io::CheckpointData again = make_data(5, false);
  again.state["note"] = "second";
  again.model = {{"only", ones({2})}};
  io::save_checkpoint(tmp.path, again);
  const io::Checkpoint ck = *io::load_latest_checkpoint(tmp.path);
  CHECK(ck.state["note"] == "second");
  CHECK(ck.model.tensors.size() == 1);
  CHECK_FALSE(ck.optimizer.has_value());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step_5"});
}

TEST_CASE("leftovers of a crash are ignored when loading and removed by the next save", "[checkpoint]") {
  TempDir tmp("ck_crash");
  const fs::path root = tmp.path;
  io::save_checkpoint(root, make_data(5));
  // A save of step 7 that died before its rename: a complete-looking but temporary directory.
  fs::create_directories(root / "step_7.tmp");
  write_raw(root / "step_7.tmp" / "model.safetensors", "partial");
  write_raw(root / "step_7.tmp" / "state.json", "{\"step\": 7}");
  // A prune of step 3 that died while removing its files (it renames the folder first).
  fs::create_directories(root / "step_3.pruned.tmp");
  write_raw(root / "step_3.pruned.tmp" / "state.json", "{\"step\": 3}");
  // A step directory someone emptied by hand, and unrelated files.
  fs::create_directories(root / "step_9");
  write_raw(root / "step_9" / "state.json", "{}");
  write_raw(root / "notes.txt", "keep me");
  fs::create_directories(root / "step_x");

  CHECK(steps_of(root) == std::vector<int64_t>{5});
  CHECK(io::latest_checkpoint_step(root) == 5);
  CHECK(io::load_latest_checkpoint(root)->state["step"] == 5);

  // Without a `latest` file (or with a stale one) the highest complete checkpoint is found by scanning.
  fs::remove(root / "latest");
  CHECK(io::latest_checkpoint_step(root) == 5);
  write_raw(root / "latest", "step_99\n");
  CHECK(io::latest_checkpoint_step(root) == 5);
  write_raw(root / "latest", "garbage");
  CHECK(io::latest_checkpoint_step(root) == 5);

  io::save_checkpoint(root, make_data(6));
  CHECK_FALSE(fs::exists(root / "step_7.tmp"));
  CHECK_FALSE(fs::exists(root / "step_3.pruned.tmp"));
  CHECK(fs::exists(root / "notes.txt"));
  CHECK(fs::exists(root / "step_9"));  // not ours to delete
  CHECK(io::latest_checkpoint_step(root) == 6);
}

TEST_CASE("a failed save leaves the previous checkpoints and no temporary directory", "[checkpoint]") {
  TempDir tmp("ck_fail");
  const fs::path root = tmp.path;
  io::save_checkpoint(root, make_data(5));
  io::CheckpointData bad = make_data(6);
  bad.optimizer->emplace_back("packed", empty({4}, {DType::i4x2}));  // safetensors cannot hold it
  CHECK_THROWS_WITH(io::save_checkpoint(root, bad), HasSubstr("packed int4"));
  CHECK_FALSE(fs::exists(root / "step_6.tmp"));
  CHECK_FALSE(fs::exists(root / "step_6"));
  CHECK(read_file(root / "latest") == "step_5\n");

  // Replacing an existing step that fails keeps the old one.
  io::CheckpointData bad5 = bad;
  bad5.step = 5;
  CHECK_THROWS(io::save_checkpoint(root, bad5));
  CHECK(io::load_latest_checkpoint(root)->state["step"] == 5);
  CHECK(io::load_latest_checkpoint(root)->optimizer.has_value());

  io::CheckpointData no_model = make_data(8);
  no_model.model.clear();
  CHECK_THROWS_WITH(io::save_checkpoint(root, no_model), HasSubstr("no model tensors"));
  CHECK_THROWS_WITH(io::save_checkpoint(root, make_data(-1)), HasSubstr("step must be >= 0"));
}

TEST_CASE("loading errors name the checkpoint directory and the file", "[checkpoint]") {
  TempDir tmp("ck_errors");
  const fs::path root = tmp.path;
  const fs::path dir = io::save_checkpoint(root, make_data(3));

  SECTION("state.json missing") {
    fs::remove(dir / "state.json");
    CHECK_THROWS_WITH(io::load_checkpoint_dir(dir), HasSubstr(dir.string()) && HasSubstr("state.json is missing"));
  }
  SECTION("state.json corrupt") {
    write_raw(dir / "state.json", "{\"step\": ");
    CHECK_THROWS_WITH(io::load_checkpoint_dir(dir), HasSubstr(dir.string()) && HasSubstr("state.json is not valid JSON"));
  }
  SECTION("model.safetensors truncated") {
    const std::string bytes = read_file(dir / "model.safetensors");
    write_raw(dir / "model.safetensors", bytes.substr(0, bytes.size() - 3));
    CHECK_THROWS_WITH(io::load_checkpoint_dir(dir), HasSubstr((dir / "model.safetensors").string()) &&
                                                        HasSubstr("out of range"));
  }
  SECTION("optimizer.safetensors corrupt") {
    write_raw(dir / "optimizer.safetensors", "nope");
    CHECK_THROWS_WITH(io::load_latest_checkpoint(root),
                      HasSubstr((dir / "optimizer.safetensors").string()) && HasSubstr("file too small"));
  }
  SECTION("not a directory") {
    CHECK_THROWS_WITH(io::load_checkpoint_dir(root / "step_4"), HasSubstr("step_4") && HasSubstr("not a directory"));
  }
}

// A sharded save: the ranks' files are written into step_<N>.shards.tmp and adopted by the save; the folder they
// leave empty is removed silently, while a real leftover of an interrupted save is still reported.
TEST_CASE("a save that adopts files removes their emptied folder without reporting it as a leftover",
          "[checkpoint]") {
  TempDir tmp("ck_adopt");
  const fs::path root = tmp.path;
  std::string log;
  {
    const test::LogCapture capture(SPDLOG_LEVEL_INFO);
    fs::create_directories(root / "step_2.shards.tmp");
    write_raw(root / "step_2.shards.tmp" / "shard-0-of-1.safetensors", "shard bytes");
    fs::create_directories(root / "step_1.shards.tmp");  // an interrupted save's
    io::CheckpointData d = make_data(2);
    d.adopt_files = {root / "step_2.shards.tmp" / "shard-0-of-1.safetensors"};
    io::save_checkpoint(root, d);
    log = capture.str();
  }
  CHECK(read_file(root / "step_2" / "shard-0-of-1.safetensors") == "shard bytes");
  CHECK_FALSE(fs::exists(root / "step_2.shards.tmp"));
  CHECK_FALSE(fs::exists(root / "step_1.shards.tmp"));
  INFO(log);
  CHECK(log.find("step_2.shards.tmp") == std::string::npos);
  CHECK(log.find("step_1.shards.tmp left by an interrupted checkpoint save") != std::string::npos);
}

TEST_CASE("a latest or best pointer file resolves to the checkpoint it names; other paths stay", "[checkpoint]") {
  TempDir tmp("ck_pointer");
  const fs::path root = tmp.path;
  io::save_checkpoint(root, make_data(10), {.best = io::MarkBest::yes});
  io::save_checkpoint(root, make_data(20));
  CHECK(io::resolve_checkpoint_pointer(root / "latest") == io::checkpoint_dir(root, 20));
  CHECK(io::resolve_checkpoint_pointer(root / "best") == io::checkpoint_dir(root, 10));
  CHECK(io::resolve_checkpoint_pointer(io::checkpoint_dir(root, 10)) == io::checkpoint_dir(root, 10));
  CHECK(io::resolve_checkpoint_pointer(root) == root);
  fs::remove_all(io::checkpoint_dir(root, 10));  // best now names a checkpoint that is gone
  CHECK_THROWS_WITH(io::resolve_checkpoint_pointer(root / "best"),
                    HasSubstr("checkpoint pointer '" + (root / "best").string() + "' names no complete checkpoint"));
}

namespace {

// step_<step> written with `note` in its state and a tensor that says which write it is.
io::CheckpointData write_of(int64_t step, const std::string& note, double value) {
  io::CheckpointData d = make_data(step);
  d.state["note"] = note;
  d.model.emplace_back("which", full({3}, value, {DType::f32}));
  return d;
}

// The names in `root`, sorted.
std::vector<std::string> names_in(const fs::path& root) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// What a save of step 5 again leaves when the process is stopped between its two renames (on a file system without
// RENAME_EXCHANGE): step_5.old.tmp (the previous copy, `previous`), step_5.tmp (the new copy, complete and fsync'ed,
// `next`) and no step_5, while `latest` (and `best` when marked) name step_5. Built by hand in `root`.
void stopped_between_renames(const fs::path& root, const io::CheckpointData& previous, const io::CheckpointData& next,
                             const io::CheckpointSaveOptions& opts) {
  io::save_checkpoint(root, previous, opts);
  const fs::path side = root.parent_path() / (root.filename().string() + "_side");
  const fs::path written = io::save_checkpoint(side, next);
  fs::rename(io::checkpoint_dir(root, next.step), root / "step_5.old.tmp");
  fs::rename(written, root / "step_5.tmp");
  fs::remove_all(side);
  REQUIRE_FALSE(fs::exists(root / "step_5"));
}

Tensor which_of(const io::Checkpoint& ck) { return ck.model.tensors.at("which"); }

// The note in the state of the checkpoint `latest` resolves to.
std::string latest_note(const fs::path& root) {
  const std::optional<io::Checkpoint> ck = io::load_latest_checkpoint(root);
  REQUIRE(ck.has_value());
  return ck->state.at("note").get<std::string>();
}

}  // namespace

TEST_CASE("a replacement stopped between its two renames puts the new copy back", "[checkpoint]") {
  TempDir tmp("ck_between_renames");
  const fs::path root = tmp.path / "checkpoints";
  // keep_last 1 and best: step_5 is the run's only checkpoint, and `latest` and `best` name it.
  const io::CheckpointSaveOptions opts{.keep_last = 1, .best = io::MarkBest::yes};
  stopped_between_renames(root, write_of(5, "first", 1.0), write_of(5, "second", 2.0), opts);
  const auto put_back = [&](const std::string& log) {
    CHECK(names_in(root) == std::vector<std::string>{"best", "latest", "step_5"});
    const io::Checkpoint ck = io::load_checkpoint_dir(root / "step_5");
    CHECK(ck.state["note"] == "second");
    CHECK(ck.step == 5);
    CHECK(same_bits(which_of(ck), full({3}, 2.0, {DType::f32})));
    INFO(log);
    CHECK(log.find("recovered " + (root / "step_5").string() + " from " + (root / "step_5.tmp").string()) !=
          std::string::npos);
  };
  const test::LogCapture capture(SPDLOG_LEVEL_INFO);

  SECTION("latest") {
    CHECK(io::latest_checkpoint_step(root) == 5);
    put_back(capture.str());
    CHECK(latest_note(root) == "second");
  }
  SECTION("best") {
    CHECK(io::best_checkpoint_step(root) == 5);
    put_back(capture.str());
  }
  SECTION("the pointer files and the folder named directly") {
    SECTION("latest") { CHECK(io::resolve_checkpoint_pointer(root / "latest") == root / "step_5"); }
    SECTION("best") { CHECK(io::resolve_checkpoint_pointer(root / "best") == root / "step_5"); }
    SECTION("step_5") { CHECK(io::resolve_checkpoint_pointer(root / "step_5") == root / "step_5"); }
    put_back(capture.str());
  }
  SECTION("the listing") {
    CHECK(steps_of(root) == std::vector<int64_t>{5});
    put_back(capture.str());
  }
  SECTION("the next save, whose clean-up removes leftovers") {
    io::save_checkpoint(root, write_of(6, "sixth", 6.0), {.keep_last = 2});
    CHECK(steps_of(root) == std::vector<int64_t>{5, 6});
    CHECK(io::load_checkpoint_dir(root / "step_5").state["note"] == "second");
    CHECK(io::latest_checkpoint_step(root) == 6);
    CHECK(io::best_checkpoint_step(root) == 5);
  }
  SECTION("the next save of the same step") {
    io::save_checkpoint(root, write_of(5, "third", 3.0), opts);
    CHECK(names_in(root) == std::vector<std::string>{"best", "latest", "step_5"});
    CHECK(latest_note(root) == "third");
  }
}

TEST_CASE("a stopped replacement with only the previous copy complete puts that back", "[checkpoint]") {
  TempDir tmp("ck_between_renames_old");
  const fs::path root = tmp.path / "checkpoints";
  stopped_between_renames(root, write_of(5, "first", 1.0), write_of(5, "second", 2.0), {});
  fs::remove(root / "step_5.tmp" / "state.json");  // not what save_checkpoint leaves, but a folder older code may
  CHECK(io::latest_checkpoint_step(root) == 5);
  CHECK(latest_note(root) == "first");
  CHECK_FALSE(fs::exists(root / "step_5.old.tmp"));
  io::save_checkpoint(root, write_of(6, "sixth", 6.0));
  CHECK(names_in(root) == std::vector<std::string>{"latest", "step_5", "step_6"});
}

TEST_CASE("a complete step_<N>.tmp alone (a save before its rename) is not published", "[checkpoint]") {
  TempDir tmp("ck_tmp_alone");
  const fs::path root = tmp.path / "checkpoints";
  io::save_checkpoint(root, write_of(5, "fifth", 5.0));
  const fs::path side = tmp.path / "side";
  fs::rename(io::save_checkpoint(side, write_of(7, "seventh", 7.0)), root / "step_7.tmp");
  CHECK(io::latest_checkpoint_step(root) == 5);
  CHECK(steps_of(root) == std::vector<int64_t>{5});
  io::save_checkpoint(root, write_of(6, "sixth", 6.0));
  CHECK(names_in(root) == std::vector<std::string>{"latest", "step_5", "step_6"});
}

TEST_CASE("saving a step again swaps the new checkpoint in and leaves no leftovers", "[checkpoint]") {
  TempDir tmp("ck_swap");
  const fs::path root = tmp.path;
  int between_renames = 0;
  const auto count = [&](const fs::path&) { ++between_renames; };
  SECTION("renameat2(RENAME_EXCHANGE)") {
    io::set_replace_test_hooks({.between_renames = count});
    io::save_checkpoint(root, write_of(5, "first", 1.0), {.best = io::MarkBest::yes});
    io::save_checkpoint(root, write_of(5, "second", 2.0), {.best = io::MarkBest::yes});
    CHECK(between_renames == 0);  // the two-rename path was not taken (the test folder's file system exchanges)
  }
  SECTION("two renames, where the file system refuses the exchange") {
    io::set_replace_test_hooks({.exchange = io::ExchangeSupport::refused, .between_renames = count});
    io::save_checkpoint(root, write_of(5, "first", 1.0), {.best = io::MarkBest::yes});
    io::save_checkpoint(root, write_of(5, "second", 2.0), {.best = io::MarkBest::yes});
    CHECK(between_renames == 1);
  }
  io::set_replace_test_hooks({});
  CHECK(names_in(root) == std::vector<std::string>{"best", "latest", "step_5"});
  const std::optional<io::Checkpoint> latest = io::load_latest_checkpoint(root);
  REQUIRE(latest.has_value());
  const io::Checkpoint& ck = *latest;
  CHECK(ck.state["note"] == "second");
  CHECK(same_bits(which_of(ck), full({3}, 2.0, {DType::f32})));
  CHECK(names_in(root / "step_5") ==
        std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "state.json"});
}

TEST_CASE("the leftover clean-up keeps a complete copy of a missing checkpoint that best names", "[checkpoint]") {
  TempDir tmp("ck_only_copy");
  const fs::path root = tmp.path / "checkpoints";
  io::save_checkpoint(root, write_of(5, "fifth", 5.0), {.best = io::MarkBest::yes});
  // step_5 gone and a complete step_5.tmp in its place, with no step_5.old.tmp that marks a replacement to put back.
  fs::rename(root / "step_5", root / "step_5.tmp");
  std::string log;
  {
    const test::LogCapture capture(SPDLOG_LEVEL_INFO);
    for (int64_t s : {6, 7}) io::save_checkpoint(root, write_of(s, "later", 1.0 * s), {.keep_last = 1});
    log = capture.str();
  }
  CHECK(names_in(root) == std::vector<std::string>{"best", "latest", "step_5.tmp", "step_7"});
  INFO(log);
  CHECK(log.find("keeping " + (root / "step_5.tmp").string()) != std::string::npos);
  CHECK(io::load_checkpoint_dir(root / "step_5.tmp").state["note"] == "fifth");
}
