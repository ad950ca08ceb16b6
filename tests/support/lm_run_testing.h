// The tiny language-model run that the trainer-level LM tests (CPU, GPU, distributed) start from:
// configs/llm/sotu_pretrain_small.yaml with the tiny preset on the fixture text and character-level SentencePiece
// model (tests/fixtures/lm_text, lm_char.model), on the CPU in fp32, 2 epochs of at most 6 steps of 4 x 16
// tokens, every step logged, no epoch checkpoints, the token cache in the test's scratch folder.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "hadatrain/train/trainer_config.h"

namespace ht::test {

// The run writing to out_dir; `extra` --set values come after the defaults above and override them.
train::TrainerConfig tiny_lm_run(const std::filesystem::path& out_dir, const std::vector<std::string>& extra = {});

}  // namespace ht::test
