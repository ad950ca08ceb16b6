// The two spellings of a float format (Note [Float spellings] in core/spellings.h): every config key that names one
// takes fp32 or f32 (fp64 or f64), reads both to the same value, records the canonical fpN in the resolved config,
// lists both in its errors, and lets either pass where a key of another choice must hold its inert value.
#include <string>
#include <vector>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
using ht::test::error_of;

namespace {

TrainerConfig read(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return read_trainer_config(ConfigReader::from_string(yaml, "spell.yaml", overrides));
}

std::string error_reading(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { read(yaml, overrides); });
}

bool holds(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("every float key takes fp32 and f32 alike and records fp32", "[config]") {
  for (const std::string f32 : {"fp32", "f32"}) {
    INFO(f32);
    const TrainerConfig c = read("train:\n  dtype: " + f32 + "\n  precision: " + f32 + "\n"
                                 "dist:\n  mode: fsdp\n  reduce_dtype: " + f32 + "\n  gather_dtype: " + f32 + "\n");
    CHECK(c.train.dtype == DType::f32);
    CHECK(c.train.precision == Precision::fp32);
    CHECK(c.dist.reduce_dtype == DType::f32);
    CHECK(c.dist.gather_dtype == dist::GatherDType::f32);
    CHECK(holds(c.resolved_yaml, "  dtype: fp32\n  precision: fp32\n"));
    CHECK(holds(c.resolved_yaml, "  reduce_dtype: fp32\n"));
    CHECK(holds(c.resolved_yaml, "  gather_dtype: fp32\n"));
    CHECK_FALSE(holds(c.resolved_yaml, ": f32\n"));
    // The saved config reads again to itself.
    CHECK(read(c.resolved_yaml).resolved_yaml == c.resolved_yaml);
  }
  for (const std::string f64 : {"fp64", "f64"}) {
    const TrainerConfig c = read("train:\n  dtype: " + f64 + "\n");
    CHECK(c.train.dtype == DType::f64);
    CHECK(holds(c.resolved_yaml, "  dtype: fp64\n"));
  }
  // A --set spells it either way too; the defaults are recorded as fp32.
  CHECK(read("", {"dist.mode=fsdp", "dist.reduce_dtype=f32"}).dist.reduce_dtype == DType::f32);
  CHECK(read("dist:\n  mode: fsdp\n  reduce_dtype: bf16\n").dist.reduce_dtype == DType::bf16);
  const TrainerConfig d = read("dist:\n  mode: fsdp\n");
  CHECK(holds(d.resolved_yaml, "  dtype: fp32\n  precision: fp32\n"));
  CHECK(holds(d.resolved_yaml, "  reduce_dtype: fp32\n"));
}

TEST_CASE("a float key's error lists both spellings of what it takes", "[config]") {
  CHECK(error_reading("train:\n  precision: float32\n") ==
        "spell.yaml:2:14: train.precision: expected one of fp32 (or f32), bf16, got float32");
  CHECK(error_reading("train:\n  dtype: f16\n") ==
        "spell.yaml:2:10: train.dtype: expected one of fp32 (or f32), fp64 (or f64), got f16");
  // An alias reads only where the name it stands for is taken.
  CHECK(error_reading("train:\n  precision: f64\n") ==
        "spell.yaml:2:14: train.precision: expected one of fp32 (or f32), bf16, got f64");
  CHECK(error_reading("dist:\n  mode: fsdp\n  reduce_dtype: fp16\n") ==
        "spell.yaml:3:17: dist.reduce_dtype: expected one of fp32 (or f32), bf16, got fp16");
  CHECK(error_of([&] { read("", {"dist.mode=fsdp", "dist.gather_dtype=float32"}); }) ==
        "--set dist.gather_dtype=float32: dist.gather_dtype: expected one of fp32 (or f32), bf16, int8, fp8, got "
        "float32");
}

TEST_CASE("a float key of another choice passes at its inert value in either spelling", "[config]") {
  // Under ddp the fsdp dtypes do nothing at fp32: both spellings pass and are not recorded.
  for (const std::string f32 : {"fp32", "f32"}) {
    INFO(f32);
    const TrainerConfig c = read("dist:\n  mode: ddp\n  reduce_dtype: " + f32 + "\n  gather_dtype: " + f32 + "\n");
    CHECK_FALSE(holds(c.resolved_yaml, "reduce_dtype"));
    CHECK_FALSE(holds(c.resolved_yaml, "gather_dtype"));
    // reduce_quant replaces the reduce-scatter's dtype: fp32 there does nothing.
    CHECK(read("dist:\n  mode: fsdp\n  reduce_quant: int8\n  reduce_dtype: " + f32 + "\n").dist.reduce_quant ==
          dist::ReduceQuant::int8);
  }
  CHECK(error_reading("dist:\n  mode: ddp\n  reduce_dtype: bf16\n") ==
        "spell.yaml:3:17: dist.reduce_dtype: applies to dist.mode fsdp only, got mode ddp");
  CHECK(holds(error_reading("dist:\n  mode: none\n  gather_dtype: bf16\n"),
              "spell.yaml:3:17: dist.gather_dtype: low-precision communication is for dist.mode fsdp"));
  CHECK(holds(error_reading("dist:\n  mode: fsdp\n  reduce_quant: int4\n  reduce_dtype: bf16\n"),
              "spell.yaml:4:17: dist.reduce_dtype: dist.reduce_quant int4 replaces the reduce-scatter's dtype: leave "
              "reduce_dtype at fp32 or remove it"));
}

TEST_CASE("a config.yaml saved with the f32 spelling loads and is saved with fp32", "[config]") {
  // A run's saved config (docs/runs): dist.mode none with reduce_dtype f32 and gather_dtype fp32 at their inert
  // values, train.dtype f32.
  const TrainerConfig c = load_trainer_config("docs/runs/fashion_mnist_resnet18/exact_seed0.config.yaml");
  CHECK(c.train.dtype == DType::f32);
  CHECK(c.train.precision == Precision::bf16);
  CHECK(c.dist.mode == dist::DistMode::none);
  CHECK(holds(c.resolved_yaml, "  dtype: fp32\n"));
  CHECK(read(c.resolved_yaml).resolved_yaml == c.resolved_yaml);
}

TEST_CASE("ConfigReader: an alias reads as its name, in get_enum, get_choice and reject_unless", "[config]") {
  const Spellings s = {{"f32", "fp32"}, {"single", "fp32"}};
  ConfigReader root = ConfigReader::from_string("a:\n  x: single\n  y: f32\n  z: single\n  w: f32\n", "r.yaml");
  ConfigReader a = root.child("a");
  CHECK(a.get_enum("x", "bf16", {"fp32", "bf16"}, s) == "fp32");
  enum class F { fp32, bf16 };
  CHECK(a.get_choice("y", F::bf16, {{"fp32", F::fp32}, {"bf16", F::bf16}}, s) == F::fp32);
  a.reject_unless("z", "fp32", s, "does not apply");
  a.reject_unless("w", "bf16", s, "does not apply here");
  CHECK(with_aliases("fp32", s) == "fp32 (or f32, single)");
  CHECK(root.resolved_yaml() == "a:\n  x: fp32\n  y: fp32\n");
  // z holds its inert value in another spelling and passes; w does not.
  CHECK(error_of([&] { root.finish(); }) == "r.yaml:5:6: a.w: does not apply here");
  // Without the spellings an alias is no name.
  ConfigReader plain = ConfigReader::from_string("x: f32\n", "p.yaml");
  CHECK(error_of([&] { plain.get_enum("x", "fp32", {"fp32", "bf16"}); }) ==
        "p.yaml:1:4: x: expected one of fp32, bf16, got f32");
}
