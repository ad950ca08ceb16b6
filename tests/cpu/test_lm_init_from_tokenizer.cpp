// model.init_from against data.tokenizer (Note [init_from's tokenizer] in src/train/causal_lm_setup.cpp): an LM
// checkpoint records its tokenizer's path, fingerprint and number of ids; a run that starts from it with the same
// tokenizer (any copy of the file) goes on silently, one with another number of ids is an error naming both
// tokenizers, one with as many ids but other files is a warning naming both, and a source whose tokenizer cannot be
// found is a warning that nothing could be checked. Checkpoints are edited here to stand for the other tokenizers.
#include "support/catch.h"
#include "support/testing.h"
#include "support/lm_run_testing.h"

#include <filesystem>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "hadatrain/data/tokenizer.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/train/lm_source.h"
#include "hadatrain/train/trainer.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

namespace {

const std::string kRoot = fs::current_path().string();  // tests run in the source root
const std::string kCharModel = kRoot + "/tests/fixtures/lm_char.model";

// A copy of the checkpoint folder `from` as `name`, its model.safetensors metadata changed by `edit`.
fs::path edited_checkpoint(const fs::path& from, const std::string& name, const std::function<void(io::Metadata&)>& edit) {
  const fs::path dir = test::scratch_dir() / "tok_checkpoints" / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  fs::copy(from, dir, fs::copy_options::recursive);
  io::SafetensorsContents c = io::load_safetensors(dir / "model.safetensors");
  edit(c.metadata);
  io::save_safetensors(dir / "model.safetensors", io::TensorList(c.tensors.begin(), c.tensors.end()), c.metadata);
  return dir;
}

// One training step from `source` with data.tokenizer `tokenizer`: the warnings it logged, or the error it threw.
struct Outcome {
  std::string warnings, error;
};
Outcome fine_tune(const std::string& name, const fs::path& source, const std::string& tokenizer) {
  const TrainerConfig c =
      test::tiny_lm_run(test::scratch_dir() / "tok_runs" / name,
                        {"train.max_steps=1", "model.preset=null", "model.init_from=" + source.string(),
                         "data.tokenizer=" + tokenizer});
  Outcome o;
  const test::LogCapture capture(SPDLOG_LEVEL_WARN);
  o.error = test::error_of([&] { run_training(c); });
  o.warnings = capture.str();
  return o;
}

}  // namespace

TEST_CASE("model.init_from checks data.tokenizer against the tokenizer the checkpoint records",
          "[lm_train][init_from]") {
  const TrainerConfig base = test::tiny_lm_run(test::scratch_dir() / "tok_base",
                                               {"train.max_steps=1", "checkpoint.every_steps=1"});
  run_training(base);
  const fs::path ck = fs::path(base.run.out_dir) / "checkpoints" / "step_1";
  const std::string fingerprint = data::load_tokenizer(kCharModel)->fingerprint();

  // What the checkpoint records of its tokenizer.
  const LlamaSource src = find_llama_source(ck);
  CHECK(src.tokenizer == fs::path(kCharModel));
  CHECK(src.tokenizer_fingerprint == fingerprint);
  CHECK(src.tokenizer_vocab_size == 80);

  // The same tokenizer, and a copy of its file elsewhere: nothing to say.
  const Outcome same = fine_tune("same", ck, kCharModel);
  CHECK(same.error.empty());
  CHECK(same.warnings.find("init_from") == std::string::npos);
  const fs::path copy = test::scratch_dir() / "tok_copy" / "tokenizer.model";
  fs::create_directories(copy.parent_path());
  fs::copy_file(kCharModel, copy, fs::copy_options::overwrite_existing);
  const Outcome copied = fine_tune("copied", ck, copy.string());
  CHECK(copied.error.empty());
  CHECK(copied.warnings.find("init_from") == std::string::npos);

  // A checkpoint trained with a tokenizer of another size: an error naming both tokenizers and their sizes.
  const fs::path wider = edited_checkpoint(ck, "wider", [](io::Metadata& md) {
    md[kTokenizerKey] = "/elsewhere/wide.model";
    md[kTokenizerFingerprintKey] = "sentencepiece:0123456789abcdef";
    md[kTokenizerVocabSizeKey] = "81";
  });
  const Outcome other_size = fine_tune("other_size", wider, kCharModel);
  INFO(other_size.error);
  CHECK_THAT(other_size.error,
             HasSubstr("model.init_from " + wider.string() + ": the model was trained with the tokenizer "
                       "/elsewhere/wide.model (81 ids, fingerprint sentencepiece:0123456789abcdef), but data.tokenizer " +
                       kCharModel + " (80 ids, fingerprint " + fingerprint + ") has another number of ids"));
  CHECK_THAT(other_size.error, HasSubstr("Set data.tokenizer to /elsewhere/wide.model"));

  // As many ids, another fingerprint: a warning naming both, and the run goes on.
  const fs::path lookalike = edited_checkpoint(ck, "lookalike", [](io::Metadata& md) {
    md[kTokenizerKey] = "/elsewhere/other.model";
    md[kTokenizerFingerprintKey] = "sentencepiece:0123456789abcdef";
  });
  const Outcome same_size = fine_tune("same_size", lookalike, kCharModel);
  CHECK(same_size.error.empty());
  CHECK_THAT(same_size.warnings,
             HasSubstr("model.init_from " + lookalike.string() + ": the model was trained with the tokenizer "
                       "/elsewhere/other.model (80 ids, fingerprint sentencepiece:0123456789abcdef); data.tokenizer " +
                       kCharModel + " (80 ids, fingerprint " + fingerprint + ") has as many ids but other files"));

  // A checkpoint that records only the path (written before fingerprints were recorded, or by hand): the file is
  // read. Still there, it is compared; gone, the run warns that data.tokenizer could not be checked.
  const fs::path path_only = edited_checkpoint(ck, "path_only", [](io::Metadata& md) {
    md.erase(kTokenizerFingerprintKey);
    md.erase(kTokenizerVocabSizeKey);
  });
  const Outcome read_back = fine_tune("read_back", path_only, copy.string());
  CHECK(read_back.error.empty());
  CHECK(read_back.warnings.find("init_from") == std::string::npos);
  const fs::path gone = edited_checkpoint(path_only, "gone", [](io::Metadata& md) {
    md[kTokenizerKey] = "/elsewhere/gone.model";
  });
  const Outcome unknown = fine_tune("unknown", gone, kCharModel);
  CHECK(unknown.error.empty());
  CHECK_THAT(unknown.warnings, HasSubstr("model.init_from " + gone.string() + ": it records the tokenizer "
                                         "/elsewhere/gone.model, which does not exist, so data.tokenizer " +
                                         kCharModel + " (80 ids) cannot be checked"));

  // A recorded size that is not a number is named with its file and key.
  const fs::path garbled = edited_checkpoint(ck, "garbled", [](io::Metadata& md) { md[kTokenizerVocabSizeKey] = "80x"; });
  CHECK_THAT(test::error_of([&] { find_llama_source(garbled); }),
             HasSubstr((garbled / "model.safetensors").string() + ": hadatrain.tokenizer_vocab_size holds '80x'"));
}
