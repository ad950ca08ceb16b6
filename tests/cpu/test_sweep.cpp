// Sweep plans (train/sweep.h): grid expansion and run names, the order of overrides (plan, stage, grid,
// command line; STAGE:key=value for one stage), {out_dir} and ${VAR} substitution, --only, errors naming the
// plan, and the results row read from a metrics.jsonl (final/best top-1, time, median throughput, peak memory).
#include "support/catch.h"
#include "support/testing.h"

#include <cstdlib>
#include <fstream>

#include "hadatrain/train/sweep.h"

using namespace ht;
using namespace ht::train;

namespace {
std::string write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}
}  // namespace

TEST_CASE("a plan expands stages x grid in order with the overrides in order", "[sweep]") {
  test::TempDir dir("sweep");
  const std::string cfg = write(dir.path / "a.yaml", "run: {name: a}\n");
  const std::string cfg2 = write(dir.path / "b.yaml", "run: {name: b}\n");
  setenv("HT_SWEEP_TEST_DIR", "/data/x", 1);
  const std::string plan = write(dir.path / "plan.yaml", "sweep:\n  out_dir: " + (dir.path / "out").string() +
                                                             "\n  parallel: 2\n  set: [\"train.epochs=1\"]\n"
                                                             "stages:\n  pre:\n    config: " + cfg +
                                                             "\n  fine:\n    configs: [" + cfg + ", " + cfg2 +
                                                             "]\n    set: [\"model.init_from={out_dir}/pre/checkpoints\", "
                                                             "\"data.root=${HT_SWEEP_TEST_DIR}/m\"]\n"
                                                             "    grid:\n      grad_pipeline.default.name: [exact, hlq]\n"
                                                             "      run.seed: [0, 1]\n");
  const SweepPlan p = load_sweep_plan(plan, {.overrides = {"train.device=cpu", "fine:data.train_limit=5"}});
  CHECK(p.parallel == 2);
  REQUIRE(p.runs.size() == 1 + 2 * 2 * 2);
  CHECK(p.runs[0].name == "pre");
  CHECK(p.runs[1].name == "fine-a-exact-0");
  CHECK(p.runs[2].name == "fine-a-exact-1");
  CHECK(p.runs[3].name == "fine-a-hlq-0");
  CHECK(p.runs[5].name == "fine-b-exact-0");
  CHECK(p.runs[5].config == cfg2);
  const std::string out = (dir.path / "out").string();
  CHECK(p.runs[0].overrides == std::vector<std::string>{"train.epochs=1", "train.device=cpu", "run.name=pre",
                                                         "run.out_dir=" + out + "/pre"});
  CHECK(p.runs[3].overrides ==
        std::vector<std::string>{"train.epochs=1", "model.init_from=" + out + "/pre/checkpoints", "data.root=/data/x/m",
                                 "grad_pipeline.default.name=hlq", "run.seed=0", "train.device=cpu",
                                 "data.train_limit=5", "run.name=fine-a-hlq-0", "run.out_dir=" + out + "/fine-a-hlq-0"});
  const SweepPlan only = load_sweep_plan(plan, {.only = {"pre", "*-hlq-1"}});
  int selected = 0;
  for (const auto& r : only.runs) selected += r.selected ? 1 : 0;
  CHECK(selected == 3);
  CHECK_THROWS_WITH(load_sweep_plan(plan, {.overrides = {"nope:train.epochs=2"}}), HasSubstr("has no stage 'nope'"));
  CHECK_THROWS_WITH(load_sweep_plan(plan, {.only = {"zzz*"}}), HasSubstr("no run of"));
  const std::string bad = write(dir.path / "bad.yaml", "stages:\n  s:\n    config: " + cfg + "\n    gird: {}\n");
  CHECK_THROWS_WITH(load_sweep_plan(bad), HasSubstr("gird"));
  const std::string missing = write(dir.path / "missing.yaml", "stages:\n  s:\n    config: " + (dir.path / "no.yaml").string() + "\n");
  CHECK_THROWS_WITH(load_sweep_plan(missing), HasSubstr("no.yaml is not a file"));
}

TEST_CASE("a results row: final and best top-1, time, median throughput, peak memory", "[sweep]") {
  test::TempDir dir("sweep_row");
  SweepRun run;
  run.name = "fine-hlq-0";
  run.stage = "fine";
  run.values = {{"grad_pipeline.default.name", "hlq"}};
  run.dir = dir.path;
  write(dir.path / "metrics.jsonl",
        "{\"type\": \"train\", \"step\": 10, \"loss\": 1.0, \"img_per_s\": 100.0, \"host_peak_mb\": 50.0}\n"
        "{\"type\": \"train\", \"step\": 20, \"loss\": 0.9, \"img_per_s\": 300.0, \"host_peak_mb\": 70.0}\n"
        "{\"type\": \"train\", \"step\": 30, \"loss\": 0.8, \"img_per_s\": 200.0, \"host_peak_mb\": 60.0}\n"
        "{\"type\": \"eval\", \"step\": 30, \"epoch\": 1, \"test_loss\": 0.5, \"test_acc\": 0.91, \"epoch_seconds\": 12.5}\n"
        "{\"type\": \"eval\", \"step\": 60, \"epoch\": 2, \"test_loss\": 0.6, \"test_acc\": 0.89, \"epoch_seconds\": 7.5}\n"
        "{\"type\": \"ev");  // a cut-off last line is ignored
  const SweepRow r = read_sweep_row(run, "done");
  CHECK(r.epochs == 2);
  CHECK(r.steps == 60);  // the last eval ran after step 60: steps past the last logged training window count
  CHECK(*r.final_top1 == Approx(89.0));
  CHECK(*r.best_top1 == Approx(91.0));
  CHECK(*r.final_test_loss == Approx(0.6));
  CHECK(r.seconds == Approx(20.0));
  CHECK(*r.throughput == Approx(200.0));
  CHECK(r.throughput_unit == "img/s");
  CHECK(*r.peak_mb == Approx(70.0));
  SweepPlan plan;
  plan.runs = {run};
  plan.recipe = "t";
  const std::string md = sweep_markdown(plan, {r});
  CHECK(md.find("| fine-hlq-0 | fine | hlq | done | 2 | 89.00 | 91.00 | 0.6000 | 0.5000 | - | 20.0 | 200 img/s | 70 |") !=
        std::string::npos);
  const std::string csv = sweep_csv(plan, {r});
  CHECK(csv.find("run,stage,grad_pipeline.default.name,status,epochs,steps,best_test_loss,final_ppl,final_top1") == 0);
  CHECK(csv.find("fine-hlq-0,fine,hlq,done,2,60,0.5,,89,91,0.6,20,200,img/s,70") != std::string::npos);
}

TEST_CASE("a language-model results row: final and best validation loss and the final perplexity", "[sweep]") {
  test::TempDir dir("sweep_lm_row");
  SweepRun run;
  run.name = "halo-2-fp8-0";
  run.stage = "halo";
  run.dir = dir.path;
  write(dir.path / "metrics.jsonl",
        "{\"type\": \"train\", \"step\": 4, \"loss\": 3.0, \"tok_per_s\": 9000.0, \"gpu_peak_mb\": 900.0}\n"
        "{\"type\": \"eval\", \"step\": 4, \"epoch\": 1, \"test_loss\": 2.5, \"test_ppl\": 12.18, \"epoch_seconds\": 3.0}\n"
        "{\"type\": \"eval\", \"step\": 8, \"epoch\": 2, \"test_loss\": 2.25, \"test_ppl\": 9.49, \"epoch_seconds\": 3.0}\n"
        "{\"type\": \"eval\", \"step\": 12, \"epoch\": 3, \"test_loss\": 2.75, \"test_ppl\": 15.64, \"epoch_seconds\": 3.0}\n");
  const SweepRow r = read_sweep_row(run, "done");
  CHECK(*r.final_test_loss == Approx(2.75));
  CHECK(*r.best_test_loss == Approx(2.25));  // the lowest, not the last
  CHECK(*r.final_ppl == Approx(15.64));
  CHECK_FALSE(r.final_top1.has_value());
  SweepPlan plan;
  plan.runs = {run};
  const std::string md = sweep_markdown(plan, {r});
  CHECK(md.find("| halo-2-fp8-0 | halo | done | 3 | - | - | 2.7500 | 2.2500 | 15.640 | 9.0 | 9000 tok/s | 900 |") !=
        std::string::npos);
}
