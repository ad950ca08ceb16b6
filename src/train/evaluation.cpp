// Evaluation on the test split: evaluate_test_set (for the training loop and `hadatrain eval`), run_evaluation and
// its JSON (`eval --json`).
#include "evaluation.h"

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "hadatrain/core/error.h"
#include "hadatrain/train/trainer.h"
#include "causal_lm_setup.h"
#include "checkpointer.h"
#include "distributed.h"

namespace ht::train {

EvalResult evaluate_test_set(nn::Module& model, const Task& task, const TrainerConfig& cfg, const Datasets& ds,
                             Device device, DistributedRun* dist_run) {
  const int64_t rows = ds.text_test ? ds.text_test->size() : ds.test->size();
  if (!dist_run || !dist_run->can_shard_evaluation(rows, cfg.data.eval_batch_size)) {
    const std::unique_ptr<BatchSource> loader = make_loader(cfg, ds, Split::test);
    return evaluate(model, task, *loader, device);
  }
  dist_run->broadcast_buffers(model);
  const int rank = dist_run->rank(), world = dist_run->world_size();
  const bool by_loader = task.rows_are_units();  // an image loader makes only this rank's rows
  const std::unique_ptr<BatchSource> loader =
      make_loader(cfg, ds, Split::test, by_loader ? rank : 0, by_loader ? world : 1);
  auto next = [&]() -> std::optional<data::Batch> {
    auto b = loader->next();
    if (b && b->global_rows == 0) return data::slice_rows(*b, data::row_slice(b->size(), rank, world));
    return b;
  };
  return evaluate(model, task, next, device, [&](std::vector<double>& sums) { dist_run->sum_over_ranks(sums); });
}


CheckpointEvaluation run_evaluation(const TrainerConfig& run_cfg, const std::string& checkpoint_dir, bool average) {
  // Under a launcher the ranks share the evaluation, rank 0 reports (Note [Sharded evaluation] in distributed.cpp).
  const std::unique_ptr<DistributedRun> dist_run =
      DistributedRun::start_evaluation(run_cfg, checkpoint_dir + (average ? " (its weight average, --ema)" : ""));
  const TrainerConfig cfg = with_source_seq_len(rank_config(run_cfg, dist_run.get()));  // on CUDA: the GPU LOCAL_RANK
  check_device(cfg.train.device);
  const Datasets ds = make_datasets(cfg);
  Generator init_gen(cfg.run.seed);
  // The checkpoint's weights replace every parameter (a strict load): model.init_from gives the architecture only.
  auto model = make_model(cfg, ds, init_gen, std::make_shared<Generator>(0),
                          {.weights = InitWeights::replaced_by_checkpoint});
  model->to(cfg.train.dtype);
  const EvalWeights weights = read_checkpoint_for_eval(checkpoint_dir);
  const io::Checkpoint& ck = weights.ck;
  if (weights.peft) {
    // The adapters load into the LoRA layers model.lora builds, which must compute what adapter_config.json says.
    const PeftFolder& f = *weights.peft;
    HT_CHECK(cfg.model.lora.has_value(), "--checkpoint: {} is a PEFT LoRA adapter (r {}, lora_alpha {:g}, "
             "target_modules {}), but the config has no model.lora; set model.lora to those values", ck.dir.string(),
             f.lora.rank, f.lora.alpha, nlohmann::json(f.lora.target_modules).dump());
    check_peft_lora(*cfg.model.lora, f, "--checkpoint " + ck.dir.string());
  }
  load_model_state_for_eval(*model, weights);
  if (average) {
    // The average covers the trained parameters and the buffers; frozen parameters are their own average.
    HT_CHECK(ck.ema.has_value(), "--ema: {} holds no weight average (ema.safetensors): it was written by a run "
             "without an ema section", ck.dir.string());
    model->load_state_dict(ck.ema->tensors, nn::StrictLoad::no);
  }
  model->to(cfg.train.device);
  spdlog::info("evaluating {} (step {}{}) on {}", ck.dir.string(), ck.step, average ? ", its weight average" : "",
               describe_data(cfg, ds));
  const std::unique_ptr<Task> task = make_task(cfg, *model);
  CheckpointEvaluation out;
  static_cast<EvalResult&>(out) = evaluate_test_set(*model, *task, cfg, ds, cfg.train.device, dist_run.get());
  out.checkpoint = ck.dir;
  out.step = ck.step;
  out.average = average;
  if (dist_run) {
    out.rank = dist_run->rank();
    out.world_size = dist_run->world_size();
  }
  return out;
}

std::string evaluation_json(const CheckpointEvaluation& e) {
  nlohmann::ordered_json j;
  j["checkpoint"] = e.checkpoint.string();
  j["step"] = e.step;
  j["weights"] = e.average ? "average" : "model";
  j["loss"] = e.loss;
  j["total"] = e.total;
  for (const EvalMetric& m : e.metrics) std::visit([&](auto v) { j[m.name] = v; }, m.value);
  return j.dump(2) + "\n";
}

}  // namespace ht::train
