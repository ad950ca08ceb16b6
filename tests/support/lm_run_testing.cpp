// See lm_run_testing.h.
#include "support/lm_run_testing.h"

#include "support/testing.h"

namespace ht::test {

train::TrainerConfig tiny_lm_run(const std::filesystem::path& out_dir, const std::vector<std::string>& extra) {
  const std::string root = std::filesystem::current_path().string();  // tests run in the source root
  std::vector<std::string> sets = {"train.device=cpu",
                                   "train.precision=fp32",
                                   "train.epochs=2",
                                   "train.max_steps=6",
                                   "train.log_every=1",
                                   "data.paths=[" + root + "/tests/fixtures/lm_text]",
                                   "data.val_fraction=0.25",
                                   "data.tokenizer=" + root + "/tests/fixtures/lm_char.model",
                                   "data.cache_dir=" + (scratch_dir() / "lm_cache").string(),
                                   "data.seq_len=16",
                                   "data.batch_size=4",
                                   "data.eval_batch_size=16",
                                   "model.preset=tiny",
                                   "schedule.warmup_steps=2",
                                   "checkpoint.every_epochs=0",
                                   "run.out_dir=" + out_dir.string()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return train::load_trainer_config(root + "/configs/llm/sotu_pretrain_small.yaml", sets);
}

}  // namespace ht::test
