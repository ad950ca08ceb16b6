// Where a language model's weights came from (train/provenance.h): a checkpoint converted from an HF folder records
// the folder, its files' sizes and SHA-256 and its tokenizer's fingerprint and files; an HF folder written from our
// checkpoint gets hadatrain_provenance.json beside config.json, which a later write replaces or removes; a run started
// from model.init_from records what it started from in every checkpoint, with that source's records nested, so the
// chain HF -> converted -> fine-tuned -> fine-tuned again stays traceable, and a resumed run keeps the record of the
// checkpoint it resumes. The chain is built here from a tiny run's checkpoint, through an HF folder and back.
#include "support/catch.h"
#include "support/testing.h"
#include "support/lm_run_testing.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hadatrain/core/digest.h"
#include "hadatrain/data/tokenizer.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/provenance.h"
#include "hadatrain/train/trainer.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kRoot = fs::current_path().string();  // tests run in the source root
const fs::path kCharModel = kRoot + "/tests/fixtures/lm_char.model";

using test::read_text;
std::string sha256_of(const fs::path& p) { return Sha256().add(read_text(p)).hex(); }
std::string abs(const fs::path& p) { return fs::absolute(p).lexically_normal().string(); }

io::Metadata metadata_of(const fs::path& checkpoint) {
  return io::read_safetensors_header(checkpoint / "model.safetensors").metadata;
}
json record_of(const fs::path& checkpoint, const char* key) { return json::parse(metadata_of(checkpoint).at(key)); }

// A tiny pre-training run's step-1 checkpoint (the tiny preset, the character tokenizer's 80 ids).
const fs::path& base_checkpoint() {
  static const fs::path ck = [] {
    const TrainerConfig c = test::tiny_lm_run(test::scratch_dir() / "prov_base",
                                              {"train.max_steps=1", "checkpoint.every_steps=1"});
    run_training(c);
    return fs::path(c.run.out_dir) / "checkpoints" / "step_1";
  }();
  return ck;
}

// The base checkpoint written as an HF folder as `hadatrain convert` writes it (f32, its tokenizer carried along, the
// provenance file), into `dir`; `max_shard_bytes` small enough gives shards and an index.
void write_hf_folder(const fs::path& dir, uint64_t max_shard_bytes = 5ull << 30) {
  const LlamaSource src = find_llama_source(base_checkpoint());
  models::HfWriteOptions o;
  o.dtype = DType::f32;
  o.max_shard_bytes = max_shard_bytes;
  o.copy_tokenizer_from = src.tokenizer;
  o.provenance = [&] { return hf_provenance_record(src, o.dtype, 0).dump(2); };
  models::save_hf_checkpoint(dir, *load_llama_source(src), o);
}

// A fine-tuning run from `init_from` (the character tokenizer), one checkpoint per step.
TrainerConfig fine_tune(const std::string& name, const fs::path& init_from, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"model.preset=null", "model.init_from=" + init_from.string(),
                                   "checkpoint.every_steps=1", "checkpoint.keep_last=0"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return test::tiny_lm_run(test::scratch_dir() / "prov_runs" / name, sets);
}

}  // namespace

TEST_CASE("a checkpoint converted from an HF folder records the folder, every file's SHA-256 and the tokenizer",
          "[lm_provenance]") {
  test::TempDir tmp("prov_convert");
  for (const uint64_t shard : {uint64_t{5} << 30, uint64_t{100000}}) {
    const bool sharded = shard < (uint64_t{5} << 30);
    INFO("sharded " << sharded);
    const fs::path hf = tmp.path / (sharded ? "shards" : "one");
    write_hf_folder(hf, shard);
    // config.json as the hub writes it: more keys than a LlamaConfig reads, some of them provenance.
    json cj = json::parse(read_text(hf / "config.json"));
    cj["_name_or_path"] = "meta-llama/Llama-3.2-1B";
    cj["transformers_version"] = "4.45.0";
    std::ofstream(hf / "config.json", std::ios::binary) << cj.dump(2);

    const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(hf);
    const io::CheckpointData d = checkpoint_from_hf(hf.string() + "/", hf, tok.get());
    const json r = json::parse(d.model_metadata.at(kSourceKey));
    CHECK(r["format"] == "hf");
    CHECK(r["folder"] == abs(hf));
    CHECK(r["converted_by"] == fmt::format("hadatrain {}", HADATRAIN_VERSION));
    CHECK(r["config"] == json{{"architectures", {"LlamaForCausalLM"}},
                              {"model_type", "llama"},
                              {"torch_dtype", "float32"},
                              {"dtype", "float32"},
                              {"transformers_version", "4.45.0"},
                              {"_name_or_path", "meta-llama/Llama-3.2-1B"}});
    CHECK(r["dtypes"] == json{"f32"});
    // Every file read, in order, then the provenance file; each with its size and SHA-256.
    std::vector<std::string> expected = {"config.json"};
    if (sharded) {
      expected.push_back("model.safetensors.index.json");
      for (const auto& e : fs::directory_iterator(hf))
        if (e.path().filename().string().starts_with("model-")) expected.push_back(e.path().filename().string());
      std::sort(expected.begin() + 2, expected.end());
      REQUIRE(expected.size() > 3);  // several shards
    } else {
      expected.push_back("model.safetensors");
    }
    expected.push_back(models::kHfProvenanceFile);
    REQUIRE(r["files"].size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO(expected[i]);
      CHECK(r["files"][i]["name"] == expected[i]);
      CHECK(r["files"][i]["bytes"] == fs::file_size(hf / expected[i]));
      CHECK(r["files"][i]["sha256"] == sha256_of(hf / expected[i]));
    }
    // The folder's provenance file, nested: the checkpoint the folder was written from.
    CHECK(r["provenance"] == json::parse(read_text(hf / models::kHfProvenanceFile)));
    CHECK(r["provenance"]["checkpoint"] == abs(base_checkpoint()));
    CHECK(r["provenance"]["step"] == 1);
    // The tokenizer: path, fingerprint and ids in the metadata (as a run's checkpoint records them), and its files'
    // SHA-256 in the record.
    CHECK(d.model_metadata.at(kTokenizerKey) == fs::absolute(hf).string());
    CHECK(d.model_metadata.at(kTokenizerFingerprintKey) == data::load_tokenizer(kCharModel)->fingerprint());
    CHECK(d.model_metadata.at(kTokenizerVocabSizeKey) == "80");
    CHECK(r["tokenizer"]["fingerprint"] == tok->fingerprint());
    CHECK(r["tokenizer"]["vocab_size"] == 80);
    REQUIRE(r["tokenizer"]["files"].size() == 1);
    CHECK(r["tokenizer"]["files"][0]["path"] == abs(hf / "tokenizer.model"));
    CHECK(r["tokenizer"]["files"][0]["sha256"] == sha256_of(kCharModel));
    CHECK(r["tokenizer"]["files"][0]["bytes"] == fs::file_size(kCharModel));
    // What the converted checkpoint records, the fingerprint included, is what a run from it compares data.tokenizer
    // with (Note [init_from's tokenizer]).
    const fs::path root = tmp.path / (sharded ? "ours_shards" : "ours_one");
    io::save_checkpoint(root, d);
    const LlamaSource src = find_llama_source(root);
    CHECK(src.tokenizer_fingerprint == tok->fingerprint());
    CHECK(src.tokenizer_vocab_size == 80);
  }
  // Without a tokenizer, none is recorded.
  const io::CheckpointData bare = checkpoint_from_hf(tmp.path / "one", {}, nullptr);
  CHECK(bare.model_metadata.count(kTokenizerKey) == 0);
  CHECK(bare.model_metadata.count(kTokenizerFingerprintKey) == 0);
  CHECK_FALSE(json::parse(bare.model_metadata.at(kSourceKey)).contains("tokenizer"));
  // A provenance file that is not a JSON object is named, not carried as if it were one.
  std::ofstream(tmp.path / "one" / models::kHfProvenanceFile, std::ios::binary) << "[1, 2";
  CHECK_THAT(test::error_of([&] { checkpoint_from_hf(tmp.path / "one", {}, nullptr); }),
             HasSubstr((tmp.path / "one" / models::kHfProvenanceFile).string() + ": not a JSON object"));
}

TEST_CASE("an HF folder written from our checkpoint says what it came from in its own file, which the next write "
          "replaces or removes",
          "[lm_provenance]") {
  test::TempDir tmp("prov_hf");
  const fs::path hf = tmp.path / "hf";
  write_hf_folder(hf);
  const json p = json::parse(read_text(hf / models::kHfProvenanceFile));
  CHECK(p["format"] == "hadatrain");
  CHECK(p["checkpoint"] == abs(base_checkpoint()));
  CHECK(p["step"] == 1);
  CHECK(p["dtype"] == "f32");
  CHECK(p["written_by"] == fmt::format("hadatrain {}", HADATRAIN_VERSION));
  CHECK_FALSE(p.contains("lora_merged"));
  CHECK_FALSE(p.contains("source"));  // the base checkpoint was trained from scratch: nothing to nest
  // config.json is what it is without the record: transformers reads nothing more (Note [HF provenance file]).
  const fs::path plain = tmp.path / "plain";
  {
    const LlamaSource src = find_llama_source(base_checkpoint());
    models::HfWriteOptions o;
    o.dtype = DType::f32;
    models::save_hf_checkpoint(plain, *load_llama_source(src), o);
  }
  CHECK(read_text(hf / "config.json") == read_text(plain / "config.json"));
  CHECK(read_text(hf / "model.safetensors") == read_text(plain / "model.safetensors"));
  CHECK_FALSE(fs::exists(plain / models::kHfProvenanceFile));

  // A folder written again describes the new weights only: a write without a record removes the earlier one (it
  // would describe other weights), a write with one replaces it.
  const LlamaSource src = find_llama_source(base_checkpoint());
  models::HfWriteOptions o;
  o.dtype = DType::bf16;
  models::save_hf_checkpoint(hf, *load_llama_source(src), o);
  CHECK_FALSE(fs::exists(hf / models::kHfProvenanceFile));
  o.provenance = [&] { return hf_provenance_record(src, o.dtype, 3).dump(2); };
  models::save_hf_checkpoint(hf, *load_llama_source(src), o);
  const json again = json::parse(read_text(hf / models::kHfProvenanceFile));
  CHECK(again["dtype"] == "bf16");
  CHECK(again["lora_merged"] == 3);

  // A llama2.c file: its path, version, size and SHA-256.
  const fs::path bin = tmp.path / "model.bin";
  std::ofstream(bin, std::ios::binary) << std::string(1000, 'a');
  const json l = llama2c_provenance_record(bin, 1, sha256_file(bin));
  CHECK(l["format"] == "llama2c");
  CHECK(l["file"] == abs(bin));
  CHECK(l["version"] == 1);
  CHECK(l["bytes"] == 1000);
  CHECK(l["sha256"] == "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");  // Python's hashlib
}

TEST_CASE("a run from model.init_from records what it started from in every checkpoint, nested down the chain, and "
          "a resume keeps the record",
          "[lm_provenance]") {
  const fs::path work = test::scratch_dir() / "prov_chain";
  fs::remove_all(work);
  // HF folder -> our checkpoint (as hadatrain convert makes it).
  const fs::path hf = work / "hf";
  write_hf_folder(hf);
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(hf);
  const fs::path converted = work / "converted";
  io::save_checkpoint(converted, checkpoint_from_hf(hf, hf, tok.get()));
  const json converted_source = record_of(converted / "step_0", kSourceKey);

  // Fine-tuned from the converted checkpoint: each checkpoint records it, its source record nested as it is.
  const TrainerConfig a = fine_tune("a", converted, {"train.max_steps=2"});
  run_training(a);
  const fs::path a_root = fs::path(a.run.out_dir) / "checkpoints";
  const json a_record = record_of(a_root / "step_2", kInitFromKey);
  CHECK(a_record == json{{"model.init_from", converted.string()},
                         {"folder", abs(converted / "step_0")},
                         {"kind", "checkpoint"},
                         {"step", 0},
                         {"source", converted_source}});
  CHECK(record_of(a_root / "step_1", kInitFromKey) == a_record);
  CHECK(metadata_of(a_root / "step_2").count(kSourceKey) == 0);  // trained, not converted

  // Fine-tuned again from the first run's root (its latest, step 2), stopped after step 1 and resumed. Before the
  // resume the root's latest moves back to step 1: the resumed run's weights still descend from step 2, and its
  // record says so.
  const TrainerConfig b = fine_tune("b", a_root, {"train.max_steps=1"});
  run_training(b);
  const fs::path b_root = fs::path(b.run.out_dir) / "checkpoints";
  const json b_record = record_of(b_root / "step_1", kInitFromKey);
  CHECK(b_record == json{{"model.init_from", a_root.string()},
                         {"folder", abs(a_root / "step_2")},
                         {"kind", "checkpoint"},
                         {"step", 2},
                         {"init_from", a_record}});
  std::ofstream(a_root / "latest", std::ios::binary) << "step_1\n";
  run_training(fine_tune("b", a_root, {"train.max_steps=2"}), {.kind = ResumeFrom::Kind::latest});
  CHECK(record_of(b_root / "step_2", kInitFromKey) == b_record);

  // The line of descent, newest first, as inspect-checkpoint prints it.
  const std::vector<std::string> lines = provenance_lines(metadata_of(b_root / "step_2"));
  const std::vector<std::string> expected = {
      fmt::format("trained from the checkpoint {} (step 2)", abs(a_root / "step_2")),
      fmt::format("which was trained from the checkpoint {} (step 0)", abs(converted / "step_0")),
      fmt::format("which was converted from the HF folder {} (3 file(s), each with its SHA-256)", abs(hf)),
      fmt::format("which hadatrain convert wrote from the checkpoint {} (step 1)", abs(base_checkpoint()))};
  CHECK(lines == expected);

  // Started from the HF folder itself: its files' SHA-256, as a conversion records them.
  const TrainerConfig c = fine_tune("c", hf, {"train.max_steps=1"});
  run_training(c);
  const json c_record = record_of(fs::path(c.run.out_dir) / "checkpoints" / "step_1", kInitFromKey);
  CHECK(c_record["kind"] == "hf");
  CHECK(c_record["folder"] == abs(hf));
  CHECK(c_record["source"] == hf_source_record(hf, models::read_hf_layout(hf)));
  CHECK(c_record["source"]["files"][1]["sha256"] == sha256_of(hf / "model.safetensors"));
  CHECK(provenance_lines(metadata_of(fs::path(c.run.out_dir) / "checkpoints" / "step_1")).front() ==
        fmt::format("trained from the HF folder {} (3 file(s), each with its SHA-256)", abs(hf)));

  // A run from scratch records none; a record in its source that is not JSON is named with its file and key.
  CHECK(metadata_of(base_checkpoint()).count(kInitFromKey) == 0);
  CHECK(provenance_lines(metadata_of(base_checkpoint())).empty());
  const fs::path garbled = work / "garbled";
  fs::copy(a_root / "step_2", garbled, fs::copy_options::recursive);
  io::SafetensorsContents m = io::load_safetensors(garbled / "model.safetensors");
  m.metadata[kInitFromKey] = "{\"kind\": ";
  io::save_safetensors(garbled / "model.safetensors", io::TensorList(m.tensors.begin(), m.tensors.end()), m.metadata);
  CHECK_THAT(test::error_of([&] { run_training(fine_tune("d", garbled, {"train.max_steps=1"})); }),
             HasSubstr((garbled / "model.safetensors").string() + ": the metadata \"hadatrain.init_from\" is not what "
                                                                   "hadatrain writes"));
  // inspect-checkpoint reads such a record without failing.
  CHECK(provenance_lines(m.metadata) == std::vector<std::string>{"trained from a model whose record is not what "
                                                                 "hadatrain writes"});
}

TEST_CASE("the record of what a run started from names the checkpoint its weights were read from, even when the "
          "root's latest moves while the run starts",
          "[lm_provenance]") {
  // A root with step_1 and step_2, latest at step_2.
  const TrainerConfig pre = test::tiny_lm_run(test::scratch_dir() / "prov_moving_src",
                                              {"train.max_steps=2", "checkpoint.every_steps=1", "checkpoint.keep_last=0"});
  run_training(pre);
  const fs::path root = fs::path(pre.run.out_dir) / "checkpoints";
  REQUIRE(read_text(root / "latest").starts_with("step_2"));
  // Another run moves latest back to step_1 the moment the weights are loaded, before the record is made (the seam
  // is the log line that says which weights were loaded).
  std::string loaded;
  {
    test::LogCapture log(2, [&](const std::string& message) {
      if (!message.starts_with("model.init_from: weights of ") || !loaded.empty()) return;
      loaded = message.substr(std::string("model.init_from: weights of ").size());
      std::ofstream(root / "latest", std::ios::binary) << "step_1\n";
    });
    run_training(fine_tune("moving", root, {"train.max_steps=1"}));
  }
  CHECK(loaded == (root / "step_2").string());
  CHECK(read_text(root / "latest").starts_with("step_1"));  // the seam ran
  const json r = record_of(fs::path(fine_tune("moving", root).run.out_dir) / "checkpoints" / "step_1", kInitFromKey);
  CHECK(r["folder"] == abs(root / "step_2"));
  CHECK(r["step"] == 2);
  CHECK(r["model.init_from"] == root.string());
}
