// Strict YAML configs: typed values with defaults and ranges, unknown keys, malformed YAML, --set overrides
// and the resolved config; every error names file:line:column (or the --set) and the dotted key.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/core/config_reader.h"
#include "hadatrain/train/trainer_config.h"

using namespace ht;
using namespace ht::train;
namespace fs = std::filesystem;

using ht::test::TempDir;
using ht::test::error_of;

namespace {

fs::path temp_dir() {
  static const TempDir dir;
  return dir.path;
}

std::string write_config(const std::string& name, const std::string& text) {
  const fs::path p = temp_dir() / name;
  std::ofstream(p) << text;
  return p.string();
}

// The message of the ht::Error thrown by f, or "" when nothing was thrown.
// Line numbers matter below: optim.lr's value is at line 6, column 7.
const char* const kConfig =
    "run:\n"                 // 1
    "  name: t\n"            // 2
    "data:\n"                // 3
    "  batch_size: 32\n"     // 4
    "optim:\n"               // 5
    "  lr: 0.1\n"            // 6
    "  momentum: 0.5\n"      // 7
    "model:\n"               // 8
    "  hidden: [64, 32]\n";  // 9

}  // namespace

TEST_CASE("a config file fills the typed sections; absent keys take their defaults", "[config]") {
  const std::string path = write_config("good.yaml", kConfig);
  const TrainerConfig c = load_trainer_config(path);
  CHECK(c.run.name == "t");
  CHECK(c.run.out_dir == "runs/t");
  CHECK(c.run.seed == 0);
  CHECK(c.data.dataset == DatasetKind::fashion_mnist);
  CHECK(c.data.root == "/usr/share/datasets/fashion-mnist");
  CHECK(c.data.batch_size == 32);
  CHECK(c.data.train_limit == 0);
  CHECK(c.data.normalize_mean == std::vector<double>{0.28604});
  CHECK(c.data.normalize_std == std::vector<double>{0.35302});
  CHECK(c.model.hidden == std::vector<int64_t>{64, 32});
  CHECK(c.model.activation == "relu");
  CHECK(c.optim.lr == 0.1);
  CHECK(c.optim.momentum == 0.5);
  CHECK_FALSE(c.optim.nesterov);
  CHECK(c.train.device == Device::cpu());
  CHECK(c.train.dtype == DType::f32);
  CHECK(c.train.cuda_graph == "auto");
  CHECK(c.source == path);
}

TEST_CASE("an empty config is all defaults and the run is named after the file", "[config]") {
  const TrainerConfig c = load_trainer_config(write_config("my_run.yaml", ""));
  CHECK(c.run.name == "my_run");
  CHECK(c.run.out_dir == "runs/my_run");
  CHECK(c.data.batch_size == 64);
  CHECK(c.model.hidden == std::vector<int64_t>{256, 128});
  CHECK(c.optim.momentum == 0.9);
  CHECK(c.train.epochs == 3);
  CHECK(c.data.pin_memory);
  CHECK_FALSE(load_trainer_config(write_config("nopin.yaml", ""), {"data.pin_memory=false"}).data.pin_memory);
  CHECK_FALSE(c.train.tf32);
  CHECK(load_trainer_config(write_config("tf32.yaml", ""), {"train.tf32=true"}).train.tf32);
  CHECK(c.grad_pipeline.default_spec.name == "exact");
  CHECK(c.grad_pipeline.overrides.empty());
}

TEST_CASE("malformed YAML is reported with file:line:column", "[config]") {
  const std::string path = write_config("broken.yaml", "run:\n  name: t\nmodel:\n  hidden: [64, 32\noptim:\n");
  const std::string msg = error_of([&] { load_trainer_config(path); });
  CHECK_THAT(msg, HasSubstr(path + ":5:"));
  CHECK_THAT(msg, HasSubstr("invalid YAML"));
  CHECK_THAT(error_of([&] { load_trainer_config(write_config("tab.yaml", "run: {name: [}\n")); }),
             HasSubstr("tab.yaml:1:"));
}

TEST_CASE("a tab in the indentation and a misindented line get different messages naming file:line:column",
          "[config]") {
  const std::string tab = write_config("tab_indent.yaml", "optim:\n  lr: 0.1\n\tmomentum: 0.9\n");
  const std::string tab_msg = error_of([&] { load_trainer_config(tab); });
  CHECK_THAT(tab_msg, HasSubstr(tab + ":3:1: a tab in the indentation: YAML indents with spaces only"));
  const std::string deep = write_config("bad_indent.yaml", "optim:\n  lr: 0.1\n   momentum: 0.9\n");
  const std::string deep_msg = error_of([&] { load_trainer_config(deep); });
  CHECK_THAT(deep_msg, HasSubstr(deep + ":3:"));
  CHECK_THAT(deep_msg, HasSubstr("check this line's indentation against the lines above"));
  CHECK(deep_msg.find("tab") == std::string::npos);
  // A tab inside a value is not indentation.
  CHECK(ConfigReader::from_string("run:\n  name: \"a\tb\"\t\n", "tab_value.yaml").child("run").get<std::string>("name", "") ==
        "a\tb");
}

TEST_CASE("invalid bytes in a config are escaped in error messages, never echoed raw", "[config]") {
  const std::string path = write_config("bytes.yaml", "optim:\n  lr: \xff\xfeok\n");
  const std::string msg = error_of([&] { load_trainer_config(path); });
  INFO(msg);
  CHECK_THAT(msg, HasSubstr("got \\xff\\xfeok"));
  // Control characters YAML does not allow are named before parsing (yaml-cpp 0.7 accepts them).
  const std::string ctl = write_config("control.yaml", "optim:\n  lr: 1\x0b\n");
  CHECK_THAT(error_of([&] { load_trainer_config(ctl); }),
             HasSubstr(ctl + ":2:8: the control character \\x0b is not allowed in YAML"));
  CHECK_THAT(error_of([&] { ConfigReader::from_string(",sizes:\x0b", "hang.yaml"); }),
             HasSubstr("hang.yaml:1:8: the control character \\x0b"));
  // yaml-cpp 0.7's LoadAll never returns on a ',' that cannot start or continue a node (",a", "&x,"); such a comma
  // is named with its line and column instead.
  CHECK_THAT(error_of([&] { ConfigReader::from_string("# c\n,a\n", "comma.yaml"); }),
             HasSubstr("comma.yaml:2:1: invalid YAML: unexpected ','; outside [ ] and { } a ',' separates nothing"));
  CHECK_THAT(error_of([&] { ConfigReader::from_string("&%,i", "anchor.yaml"); }),
             HasSubstr("anchor.yaml:1:3: invalid YAML: unexpected ','"));
  // A ',' that continues a multi-line plain scalar is valid YAML ("- a\n  ,b" is the list ["a ,b"]).
  CHECK_THAT(error_of([&] { ConfigReader::from_string("- a\n  ,b\n", "comma2.yaml"); }),
             HasSubstr("comma2.yaml:1:1: expected a map of sections at the top level (run:, data:, ...), got a list of 1"));
  // And [ ] / { } nested deeper than 8 levels (yaml-cpp's time grows exponentially with the depth; the fuzzer's
  // input with 20 nested '{' did not return), in a file and in a --set value; quoted brackets do not count.
  CHECK_THAT(error_of([&] { ConfigReader::from_string("a: 1\nb: {{{{{{{{{{{{{{{{{{{{x}}}}}}}}}}}}}}}}}}}}\n", "deep.yaml"); }),
             HasSubstr("deep.yaml:2:12: [ ] / { } nest deeper than 8 levels here"));
  CHECK_THAT(error_of([&] { load_trainer_config(write_config("deep_set.yaml", ""), {"model.hidden=[[[[[[[[[[1]]]]]]]]]]"}); }),
             HasSubstr("--set model.hidden=[[[[[[[[[[1]]]]]]]]]]: the value nests [ ] / { } deeper than 8 levels (column 9)"));
  CHECK(ConfigReader::from_string("a: \"{{{{{{{{{{{{\"\nb: [[[1]]]\n", "quoted.yaml").get<std::string>("a", "") ==
        "{{{{{{{{{{{{");
  // The same after a top-level flow collection ("{a: 1}, " and "[1], 2"), in a file and in a --set value.
  CHECK_THAT(error_of([&] { ConfigReader::from_string("{run: {name: x}}, grad_pipeline: y\n", "rootflow.yaml"); }),
             HasSubstr("rootflow.yaml:1:17: invalid YAML:"));
  CHECK_THAT(error_of([&] { ConfigReader::from_string("# c\n  [1], 2", "rootlist.yaml"); }), HasSubstr("rootlist.yaml:2:6:"));
  CHECK(ConfigReader::from_string("{name: hlq, acbp_bits: 4}  # an inspect-grads entry\n", "entry").get<int>("acbp_bits", 0) == 4);
  // And after a quoted scalar at the root ("\"\","); a quoted first key stays valid.
  CHECK_THAT(error_of([&] { ConfigReader::from_string("# c\n\"\" ,", "rootquote.yaml"); }),
             HasSubstr("rootquote.yaml:2:4: invalid YAML: unexpected ','"));
  CHECK_THAT(error_of([&] { ConfigReader::from_string("'it''s',", "rootquote2.yaml"); }), HasSubstr("rootquote2.yaml:1:8:"));
  CHECK_THAT(error_of([&] { ConfigReader::from_string("\"\"\"x\",", "q3.yaml"); }), HasSubstr("q3.yaml:1:6:"));
  CHECK_THAT(error_of([&] { ConfigReader::from_string("\"a\"\n\"b\",", "q4.yaml"); }), HasSubstr("q4.yaml:2:4:"));
  CHECK(ConfigReader::from_string("a: [\"x\", 'y']\nb: \"it, is\"  # \"c\",\n", "ok.yaml").get<std::string>("b", "") ==
        "it, is");
  CHECK(ConfigReader::from_string("\"a\": 1\n", "quotedkey.yaml").get<int>("a", 0) == 1);
  CHECK_THAT(error_of([&] { load_trainer_config(write_config("flow_set.yaml", ""), {"model.hidden=[1, 2], 3"}); }),
             HasSubstr("--set model.hidden=[1, 2], 3: the value is not valid YAML at column 7: unexpected ','"));
  CHECK(load_trainer_config(write_config("flow_set2.yaml", ""), {"model.hidden=[64, 32] "}).model.hidden ==
        std::vector<int64_t>{64, 32});
  CHECK(ConfigReader::from_string("a: [1\n  , 2]\nb: |\n  ,text\nc: {x: 1\n , y: 2}\n", "flow.yaml")
            .get_list<int>("a", {}) == std::vector<int>{1, 2});
  CHECK_THAT(error_of([&] { load_trainer_config(write_config("ctl_set.yaml", ""), {"optim.lr=1\x01"}); }),
             HasSubstr("--set optim.lr=1\\x01: the value holds the control character \\x01"));
  const std::string set = error_of([&] { load_trainer_config(write_config("bytes_set.yaml", ""), {"optim.\xc3(=1"}); });
  INFO(set);
  CHECK_THAT(set, HasSubstr("\\xc3("));
  for (const std::string& m : {msg, set})
    for (const char c : m) CHECK((static_cast<unsigned char>(c) >= 0x20 || c == '\n'));
  CHECK(msg.find('\xff') == std::string::npos);
  CHECK(set.find('\xc3') == std::string::npos);
  // Valid UTF-8 is kept as it is.
  CHECK_THAT(error_of([&] { load_trainer_config(write_config("utf8.yaml", "optim:\n  lr: \xc3\xa9t\xc3\xa9\n")); }),
             HasSubstr("got \xc3\xa9t\xc3\xa9"));
}

TEST_CASE("a second YAML document after '---' is an error naming the file and its line", "[config]") {
  const std::string path = write_config("two_docs.yaml", "optim:\n  lr: 0.1\n---\noptim:\n  momentun: 0.5\n");
  CHECK_THAT(error_of([&] { load_trainer_config(path); }), HasSubstr(path + ":4: a second YAML document"));
  CHECK_THAT(error_of([&] { ConfigReader::from_string("a: 1\n---\n---\nb: 2\n", "three.yaml"); }),
             HasSubstr("three.yaml:4: a second YAML document"));
  // One document, even with a leading `---` or a trailing separator, is read as before.
  CHECK(load_trainer_config(write_config("one_doc.yaml", "---\noptim:\n  lr: 0.25\n---\n")).optim.lr == 0.25);
}

TEST_CASE("unknown keys fail with their location, the accepted keys and a suggestion", "[config]") {
  const std::string path = write_config("unknown.yaml", "optim:\n  lr: 0.1\n  momentun: 0.5\n");
  CHECK(error_of([&] { load_trainer_config(path); }) ==
        path + ":3:3: optim.momentun: unknown key (optim accepts: name, lr, momentum, nesterov, weight_decay, decay_norm_and_bias, clip_grad_norm, lr_multipliers; "
               "did you mean 'momentum'?)");
  const std::string top = write_config("top.yaml", "run:\n  name: t\ntrainer:\n  epochs: 1\n");
  CHECK_THAT(error_of([&] { load_trainer_config(top); }),
             HasSubstr(top + ":3:1: trainer: unknown key (the top level accepts: run, data, model, optim, schedule, train, checkpoint"));
}

TEST_CASE("values of the wrong type name the key, the expected type and what was found", "[config]") {
  auto msg_for = [](const std::string& name, const std::string& text) {
    const std::string path = write_config(name, text);
    return std::make_pair(path, error_of([&] { load_trainer_config(path); }));
  };
  {
    const auto [path, msg] = msg_for("type_lr.yaml", "optim:\n  lr: fast\n");
    CHECK(msg == path + ":2:7: optim.lr: expected a number > 0, got fast");
  }
  {
    const auto [path, msg] = msg_for("type_bool.yaml", "optim:\n  nesterov: yes\n");
    CHECK(msg == path + ":2:13: optim.nesterov: expected a boolean (true or false), got yes");
  }
  {
    const auto [path, msg] = msg_for("type_quoted.yaml", "data:\n  batch_size: \"32\"\n");
    CHECK(msg == path + ":2:15: data.batch_size: expected an integer >= 1, got the quoted string \"32\"");
  }
  {
    const auto [path, msg] = msg_for("type_int.yaml", "train:\n  epochs: 2.5\n");
    CHECK(msg == path + ":2:11: train.epochs: expected an integer >= 1, got 2.5");
  }
  {
    const auto [path, msg] = msg_for("type_list.yaml", "model:\n  hidden: 256\n");
    CHECK(msg == path + ":2:11: model.hidden: expected a list of integers >= 1 such as [1, 2], got 256");
  }
  {
    const auto [path, msg] = msg_for("type_elem.yaml", "model:\n  hidden: [256, x]\n");
    CHECK(msg == path + ":2:17: model.hidden[1]: expected an integer >= 1, got x");
  }
  {
    const auto [path, msg] = msg_for("type_enum.yaml", "model:\n  activation: tanh\n");
    CHECK(msg == path + ":2:15: model.activation: expected one of relu, gelu, got tanh");
  }
  {
    const auto [path, msg] = msg_for("type_section.yaml", "optim: sgd\n");
    CHECK(msg == path + ":1:8: optim: expected a section (a map of keys), got sgd");
  }
  {
    const auto [path, msg] = msg_for("type_null.yaml", "optim:\n  lr:\n");
    CHECK(msg == path + ":2:3: optim.lr: expected a number > 0, got nothing (null)");
  }
  {
    const auto [path, msg] = msg_for("type_device.yaml", "train:\n  device: gpu\n");
    CHECK(msg == path + ":2:11: train.device: expected cpu, cuda or cuda:N, got gpu");
  }
}

TEST_CASE("out-of-range values name the allowed range", "[config]") {
  const std::string path = write_config("range.yaml", kConfig);
  CHECK(error_of([&] { load_trainer_config(write_config("lr.yaml", "optim:\n  lr: -1\n")); }) ==
        (temp_dir() / "lr.yaml").string() + ":2:7: optim.lr: expected a number > 0, got -1");
  CHECK(error_of([&] { load_trainer_config(write_config("mom.yaml", "optim:\n  momentum: 1\n")); }) ==
        (temp_dir() / "mom.yaml").string() + ":2:13: optim.momentum: expected a number in [0, 1), got 1");
  CHECK(error_of([&] { load_trainer_config(write_config("bs.yaml", "data:\n  batch_size: 0\n")); }) ==
        (temp_dir() / "bs.yaml").string() + ":2:15: data.batch_size: expected an integer >= 1, got 0");
  CHECK(error_of([&] { load_trainer_config(write_config("lim.yaml", "data:\n  train_limit: -5\n")); }) ==
        (temp_dir() / "lim.yaml").string() + ":2:16: data.train_limit: expected an integer >= 0, got -5");
  CHECK_THAT(error_of([&] { load_trainer_config(write_config("nest.yaml", "optim:\n  momentum: 0\n  nesterov: true\n")); }),
             HasSubstr("nest.yaml:3:13: optim.nesterov: nesterov momentum needs optim.momentum > 0"));
  CHECK(error_of([&] { load_trainer_config(path); }).empty());
}

TEST_CASE("dist options that cannot go together name the file, line and key", "[config]") {
  auto err = [&](const std::string& name, const std::string& dist) {
    return error_of([&] { load_trainer_config(write_config(name, "dist:\n" + dist)); });
  };
  CHECK_THAT(err("gather.yaml", "  mode: ddp\n  gather_dtype: int8\n"),
             HasSubstr("gather.yaml:3:17: dist.gather_dtype: low-precision communication is for dist.mode fsdp, got "
                       "mode ddp"));
  CHECK_THAT(err("rq.yaml", "  reduce_quant: int4\n"),
             HasSubstr("rq.yaml:2:17: dist.reduce_quant: low-precision communication is for dist.mode fsdp, got mode "
                       "none"));
  CHECK_THAT(err("block.yaml", "  mode: fsdp\n  reduce_quant: int4\n  reduce_quant_block: 255\n"),
             HasSubstr("block.yaml:4:23: dist.reduce_quant_block: expected an even number"));
  CHECK_THAT(err("rdt.yaml", "  mode: fsdp\n  reduce_quant: int8\n  reduce_dtype: bf16\n"),
             HasSubstr("rdt.yaml:4:17: dist.reduce_dtype: dist.reduce_quant int8 replaces the reduce-scatter's dtype"));
  CHECK(err("fine.yaml", "  mode: fsdp\n  reduce_quant: int4\n  reduce_quant_block: 128\n").empty());
}

TEST_CASE("duplicate keys are errors", "[config]") {
  const std::string path = write_config("dup.yaml", "optim:\n  lr: 0.1\n  lr: 0.2\n");
  CHECK(error_of([&] { load_trainer_config(path); }) ==
        path + ":3:3: optim.lr: duplicate key (first given at line 2)");
}

TEST_CASE("--set overrides values before typed parsing, and creates sections", "[config]") {
  const std::string path = write_config("set.yaml", kConfig);
  const TrainerConfig c = load_trainer_config(
      path, {"optim.lr=0.25", "model.hidden=[512, 256, 10]", "train.epochs=7", "run.name=other", "optim.lr=0.5",
             "train.device=cuda:1"});
  CHECK(c.optim.lr == 0.5);  // the last --set of a key wins
  CHECK(c.optim.momentum == 0.5);
  CHECK(c.model.hidden == std::vector<int64_t>{512, 256, 10});
  CHECK(c.train.epochs == 7);
  CHECK(c.train.device == Device::cuda(1));
  CHECK(c.run.name == "other");
  CHECK(c.run.out_dir == "runs/other");
  // --set on a file without the section.
  const TrainerConfig e = load_trainer_config(write_config("empty.yaml", ""), {"data.normalize.std=[0.5]"});
  CHECK(e.data.normalize_std == std::vector<double>{0.5});
  CHECK(load_trainer_config(path, {"train.cuda_graph=false"}).train.cuda_graph == "false");
  CHECK(load_trainer_config(path, {"train.cuda_graph=true"}).train.cuda_graph == "true");
  CHECK(error_of([&] { load_trainer_config(path, {"train.cuda_graph=sometimes"}); }) ==
        "--set train.cuda_graph=sometimes: train.cuda_graph: expected one of auto, true, false, got sometimes");
}

TEST_CASE("errors in --set values name the --set as their source", "[config]") {
  const std::string path = write_config("set_err.yaml", kConfig);
  CHECK(error_of([&] { load_trainer_config(path, {"optim.lrr=0.1"}); }) ==
        "--set optim.lrr=0.1: optim.lrr: unknown key (optim accepts: name, lr, momentum, nesterov, weight_decay, decay_norm_and_bias, clip_grad_norm, lr_multipliers; "
        "did you mean 'lr'?)");
  CHECK_THAT(error_of([&] { load_trainer_config(path, {"foo.bar=1"}); }),
             HasSubstr("--set foo.bar=1: foo: unknown key (the top level accepts: run, data, model, optim, schedule, train, checkpoint, grad_pipeline, dist, ema)"));
  CHECK(error_of([&] { load_trainer_config(path, {"optim.lr=-1"}); }) ==
        "--set optim.lr=-1: optim.lr: expected a number > 0, got -1");
  CHECK(error_of([&] { load_trainer_config(path, {"model.hidden=[1, 0]"}); }) ==
        "--set model.hidden=[1, 0]: model.hidden[1]: expected an integer >= 1, got 0");
  CHECK(error_of([&] { load_trainer_config(path, {"optim.lr"}); }) ==
        "--set optim.lr: expected key=value, for example --set optim.lr=0.05");
  CHECK(error_of([&] { load_trainer_config(path, {"optim.lr.x=1"}); }) ==
        "--set optim.lr.x=1: optim.lr is not a section (it holds 0.1), so it has no key 'x'");
  CHECK_THAT(error_of([&] { load_trainer_config(path, {"model.hidden=[1,"}); }),
             HasSubstr("--set model.hidden=[1,: the value is not valid YAML"));
  CHECK_THAT(error_of([&] { load_trainer_config(path, {"optim..lr=1"}); }), HasSubstr("bad key 'optim..lr'"));
}

TEST_CASE("the resolved config lists every value and reads back to the same config", "[config]") {
  const std::string path = write_config("resolved.yaml", kConfig);
  const TrainerConfig c = load_trainer_config(path, {"optim.weight_decay=1e-4", "run.seed=42"});
  CHECK_THAT(c.resolved_yaml, HasSubstr("optim:\n  name: sgd\n  lr: 0.1\n  momentum: 0.5\n  nesterov: false\n"
                                       "  weight_decay: 0.0001\n"));
  CHECK_THAT(c.resolved_yaml, HasSubstr("hidden: [64, 32]"));
  CHECK_THAT(c.resolved_yaml, HasSubstr("seed: 42"));
  CHECK_THAT(c.resolved_yaml, HasSubstr("normalize:\n    mean: [0.28604]\n    std: [0.35302]"));
  const TrainerConfig again = load_trainer_config(write_config("again.yaml", c.resolved_yaml));
  CHECK(again.resolved_yaml == c.resolved_yaml);
  CHECK(again.optim.weight_decay == 1e-4);
  CHECK(again.run.seed == 42);
  CHECK(again.run.name == "t");
}

TEST_CASE("ConfigReader works on its own: get, child, get_list, get_enum, require, finish", "[config]") {
  ConfigReader r = ConfigReader::from_string("a: 3\nsub:\n  xs: [1.5, 2]\n  mode: fast\n  big: 12345678901\n",
                                             "inline");
  CHECK(r.get("a", 0) == 3);
  CHECK(r.get("missing", std::string("dflt")) == "dflt");
  CHECK(r.get("flag", true));
  ConfigReader sub = r.child("sub");
  CHECK(sub.path() == "sub");
  CHECK(sub.key_path("xs") == "sub.xs");
  CHECK(sub.get_list<double>("xs", {}) == std::vector<double>{1.5, 2.0});
  CHECK(sub.get_enum("mode", "slow", {"slow", "fast"}) == "fast");
  CHECK(sub.require<int64_t>("big") == 12345678901);
  CHECK_THAT(error_of([&] { sub.get("big", 0); }), HasSubstr("inline:5:8: sub.big: expected an integer, got 12345678901"));
  CHECK(error_of([&] { sub.require<double>("absent", Range::positive()); }) ==
        "inline:2:1: sub.absent: required key is missing: expected a number > 0");
  CHECK(error_of([&] { r.finish(); }).empty());
  ConfigReader r2 = ConfigReader::from_string("a: 1\nb: 2\n", "inline2");
  r2.get("a", 0);
  CHECK(error_of([&] { r2.finish(); }) == "inline2:2:1: b: unknown key (the top level accepts: a)");
  CHECK_THAT(error_of([] { ConfigReader::from_string("- 1\n- 2\n", "list.yaml"); }),
             HasSubstr("list.yaml:1:1: expected a map of sections at the top level"));
}

TEST_CASE("the main job's config parses", "[config]") {
  // Tests run from the repository root (tests/CMakeLists.txt sets WORKING_DIRECTORY).
  const TrainerConfig c = load_trainer_config("configs/fashion_mnist_mlp.yaml");
  CHECK(c.run.name == "fashion_mnist_mlp");
  CHECK(c.data.dataset == DatasetKind::fashion_mnist);
  CHECK(c.model.hidden == std::vector<int64_t>{256, 128});
  CHECK(c.train.epochs == 3);
}

TEST_CASE("a config path that is not a file is an error", "[config]") {
  CHECK(error_of([] { load_trainer_config("no/such/config.yaml"); }) ==
        "no/such/config.yaml: config file not found (or not a regular file)");
}

TEST_CASE("--set key=null clears a key: its default applies, a cleared section reads as absent", "[config]") {
  const std::string path = write_config("clear.yaml", kConfig);
  const TrainerConfig d = load_trainer_config(write_config("clear_default.yaml", ""));
  // A value of the file goes back to its default; `~` is YAML's null too.
  CHECK(load_trainer_config(path, {"optim.momentum=null"}).optim.momentum == d.optim.momentum);
  CHECK(load_trainer_config(path, {"model.hidden=~"}).model.hidden == d.model.hidden);
  // Without the clearing, null is an error, as `lr:` with no value in a file is.
  CHECK_THAT(error_of([&] { ConfigReader::from_string("lr:\n", "null.yaml").get<double>("lr", 1.0); }),
             HasSubstr("null.yaml:1:1: lr: expected a number"));
  // A later --set of the key wins over the clearing, and the clearing over an earlier one.
  CHECK(load_trainer_config(path, {"optim.momentum=null", "optim.momentum=0.25"}).optim.momentum == 0.25);
  CHECK(load_trainer_config(path, {"optim.momentum=0.25", "optim.momentum=null"}).optim.momentum == d.optim.momentum);
  // A section: absent, so its keys take their defaults; holds_section says no.
  ConfigReader r = ConfigReader::from_string("lora:\n  rank: 8\nname: x\n", "sec.yaml", {"lora=null"});
  CHECK_FALSE(r.holds_section("lora"));
  CHECK_FALSE(r.has("lora"));
  CHECK(r.child("lora").get<int>("rank", 4) == 4);
  CHECK(r.get<std::string>("name", "") == "x");
  r.finish();
  // A key in an absent section is at its default already: no section is made to hold it.
  ConfigReader e = ConfigReader::from_string("name: x\n", "nosec.yaml", {"lora.rank=null"});
  CHECK_FALSE(e.holds_section("lora"));
  CHECK(e.child("lora").get<int>("rank", 4) == 4);
  CHECK(e.get<std::string>("name", "") == "x");
  e.finish();
  // A key the file gives is removed whatever its name: one the section does not accept (SGD's momentum under
  // --set optim.name=adamw), or one it never accepts (a misspelt key the file holds).
  const TrainerConfig adamw = load_trainer_config(path, {"optim.name=adamw", "optim.momentum=null"});
  CHECK(adamw.optim.name == OptimKind::adamw);
  CHECK(adamw.resolved_yaml.find("momentum") == std::string::npos);
  const std::string typo = write_config("clear_typo.yaml", "optim:\n  lr: 0.1\n  momentun: 0.5\n");
  CHECK_THAT(error_of([&] { load_trainer_config(typo); }), HasSubstr("optim.momentun: unknown key"));
  CHECK(load_trainer_config(typo, {"optim.momentun=null"}).optim.lr == 0.1);
  // A key nothing gave keeps its name checked, also where the path stops at a missing section, and clearing it
  // twice does not take that check away.
  CHECK_THAT(error_of([&] { load_trainer_config(path, {"optim.momentun=null", "optim.momentun=null"}); }),
             HasSubstr("--set optim.momentun=null: optim.momentun: unknown key"));
  CHECK_THAT(error_of([&] { load_trainer_config(path, {"optim.momentun=null"}); }),
             HasSubstr("--set optim.momentun=null: optim.momentun: unknown key"));
  CHECK_THAT(error_of([&] { load_trainer_config(path, {"optm.lr=null"}); }),
             HasSubstr("--set optm.lr=null: optm: unknown key (the top level accepts: run, data"));
  CHECK_THAT(error_of([&] { load_trainer_config(path, {"model.lorra.rank=null"}); }),
             HasSubstr("--set model.lorra.rank=null: model.lorra: unknown key (model accepts:"));
  CHECK(load_trainer_config(path, {"checkpoint.every_steps=null"}).optim.lr == 0.1);  // an absent, known section
}

namespace {

// read_trainer_config of `yaml` with `overrides`, and the notes its reader left.
std::pair<TrainerConfig, std::vector<std::string>> read_with_notes(const std::string& yaml,
                                                                   const std::vector<std::string>& overrides) {
  ConfigReader root = ConfigReader::from_string(yaml, "switch.yaml", overrides);
  TrainerConfig c = read_trainer_config(root);
  return {c, root.notes()};
}

}  // namespace

TEST_CASE("a --set that switches a choice drops the file's keys of the old choice, with a note", "[config]") {
  // Note [A --set that switches a choice]. optim.name: SGD's momentum and nesterov go, lr and weight_decay stay.
  const std::string sgd = "optim:\n  name: sgd\n  lr: 0.1\n  momentum: 0.5\n  nesterov: true\n  weight_decay: 1.0e-4\n";
  const auto [c, notes] = read_with_notes(sgd, {"optim.name=adamw"});
  CHECK(c.optim.name == OptimKind::adamw);
  CHECK(c.optim.lr == 0.1);
  CHECK(c.optim.weight_decay == 1e-4);
  CHECK(c.optim.beta2 == 0.999);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0] == "--set optim.name=adamw: dropped the file's optim.momentum (switch.yaml:4:3) and optim.nesterov "
                    "(switch.yaml:5:3): they apply to the file's own optim settings only; optim.lr and "
                    "optim.weight_decay keep the file's values");
  CHECK(c.resolved_yaml.find("momentum") == std::string::npos);
  // Without a switch nothing is dropped and nothing noted.
  CHECK(read_with_notes(sgd, {"optim.lr=0.2"}).second.empty());

  // A key of the old choice that a --set gives is still an error, and so is a file key that the file's own choice
  // does not read either (a misspelt key is not dropped).
  CHECK_THAT(error_of([&] { read_with_notes(sgd, {"optim.name=adamw", "optim.nesterov=false"}); }),
             HasSubstr("--set optim.nesterov=false: optim.nesterov: unknown key"));
  CHECK_THAT(error_of([&] { read_with_notes("optim:\n  momentun: 0.5\n", {"optim.name=adamw"}); }),
             HasSubstr("switch.yaml:2:3: optim.momentun: unknown key"));

  // schedule.name: multistep's milestones and gamma do not apply to cosine.
  const auto [s, s_notes] =
      read_with_notes("schedule:\n  name: multistep\n  milestones: [2, 4]\n  gamma: 0.5\n", {"schedule.name=cosine"});
  CHECK(s.schedule.name == ScheduleName::cosine);
  REQUIRE(s_notes.size() == 1);
  CHECK_THAT(s_notes[0], HasSubstr("--set schedule.name=cosine: dropped the file's schedule.milestones (switch.yaml:3:3) "
                                   "and schedule.gamma (switch.yaml:4:3)"));

  // model.name: a ResNet's stem goes when the model becomes an MLP; so do a preset's keys under model.init_from.
  CHECK(read_with_notes("model:\n  name: resnet18\n  stem: cifar\n", {"model.name=mlp"}).first.model.name ==
        ModelKind::mlp);
  const auto [l, l_notes] = read_with_notes(
      "model:\n  name: llama\n  preset: tiny\n  llama:\n    hidden_size: 64\n"
      "data:\n  dataset: text\n  paths: [a.txt]\n  tokenizer: t.model\n",
      {"model.init_from=some/checkpoint"});
  CHECK(l.model.init_from == "some/checkpoint");
  REQUIRE(l_notes.size() == 1);
  CHECK_THAT(l_notes[0], HasSubstr("dropped the file's model.preset (switch.yaml:3:3) and model.llama (switch.yaml:4:3)"));
  // Without the switch, such a key is refused with its reason.
  CHECK_THAT(error_of([&] { read_with_notes("model:\n  name: llama\n  init_from: x\n  preset: tiny\n"
                                            "data:\n  dataset: text\n  paths: [a.txt]\n  tokenizer: t.model\n",
                                            {}); }),
             HasSubstr("switch.yaml:4:11: model.preset: the architecture comes from model.init_from"));

  // A grad_pipeline entry's name: the file's HLQ options go with it, in a section below the --set's.
  const auto [g, g_notes] = read_with_notes(
      "grad_pipeline:\n  default:\n    name: hlq\n    gx_bits: 4\n    recompute_output: true\n",
      {"grad_pipeline.default.name=exact"});
  CHECK(g.grad_pipeline.default_spec.name == "exact");
  CHECK(g.grad_pipeline.default_spec.recompute_output);
  REQUIRE(g_notes.size() == 1);
  CHECK(g_notes[0] == "--set grad_pipeline.default.name=exact: dropped the file's grad_pipeline.default.gx_bits "
                      "(switch.yaml:4:5): it applies to the file's own grad_pipeline.default settings only; "
                      "grad_pipeline.default.recompute_output keeps the file's value");

  // data.rand_augment.policy: timm's `increasing` does not apply to torchvision's ops.
  const auto [r, r_notes] = read_with_notes("data:\n  rand_augment:\n    policy: timm\n    increasing: false\n",
                                            {"data.rand_augment.policy=torchvision"});
  CHECK(r.data.rand_augment->policy == data::RandAugmentPolicy::torchvision);
  REQUIRE(r_notes.size() == 1);
  CHECK_THAT(r_notes[0], HasSubstr("dropped the file's data.rand_augment.increasing (switch.yaml:4:5)"));
}

TEST_CASE("a --set that switches a choice drops the file's keys that apply to the old choice by their value",
          "[config]") {
  // Note [A --set that switches a choice], keys a choice takes at one value only (ConfigReader::reject_unless).
  // model.name llama: the file's ResNet class count goes with the stem, instead of "does not apply to llama".
  const auto [m, m_notes] = read_with_notes("model:\n  name: resnet18\n  num_classes: 10\n  stem: cifar\n",
                                            {"model.name=llama", "data.dataset=text", "data.paths=[a]",
                                             "data.tokenizer=t", "data.seq_len=16"});
  CHECK(m.model.name == ModelKind::llama);
  CHECK(m.model.num_classes == 0);
  REQUIRE(m_notes.size() == 1);
  CHECK(m_notes[0] == "--set model.name=llama: dropped the file's model.num_classes (switch.yaml:3:3) and model.stem "
                      "(switch.yaml:4:3): they apply to the file's own model settings only");
  CHECK(m.resolved_yaml.find("num_classes") == std::string::npos);
  // model.init_from cleared: init_from_reset needs it.
  const auto [i, i_notes] = read_with_notes(
      "model:\n  name: resnet18\n  init_from: w.safetensors\n  init_from_reset: [fc.*]\n", {"model.init_from=null"});
  CHECK(i.model.init_from_reset.empty());
  REQUIRE(i_notes.size() == 1);
  CHECK_THAT(i_notes[0], HasSubstr("--set model.init_from=null: dropped the file's model.init_from_reset "
                                   "(switch.yaml:4:3): it applies to the file's own model settings only"));

  // dist.mode fsdp -> ddp: every fsdp key the file gives goes, whatever its value; timeout_s applies to both.
  const std::string fsdp = "dist:\n  mode: fsdp\n  fsdp_units: [layers.]\n  prefetch: true\n  gather_dtype: int8\n"
                           "  timeout_s: 60\n";
  const auto [d, d_notes] = read_with_notes(fsdp, {"dist.mode=ddp"});
  CHECK(d.dist.mode == dist::DistMode::ddp);
  CHECK(d.dist.fsdp_units.empty());
  CHECK(d.dist.gather_dtype == dist::GatherDType::f32);
  CHECK(d.dist.timeout_s == 60);
  REQUIRE(d_notes.size() == 1);
  CHECK(d_notes[0] == "--set dist.mode=ddp: dropped the file's dist.fsdp_units (switch.yaml:3:3), dist.prefetch "
                      "(switch.yaml:4:3) and dist.gather_dtype (switch.yaml:5:3): they apply to the file's own dist "
                      "settings only; dist.timeout_s keeps the file's value");
  // ... and ddp -> fsdp: ddp's bucket size goes; dist.reduce_quant int8 replaces the file's bf16 reduce-scatter.
  CHECK_THAT(read_with_notes("dist:\n  mode: ddp\n  bucket_mb: 50\n", {"dist.mode=fsdp"}).second.at(0),
             HasSubstr("dropped the file's dist.bucket_mb (switch.yaml:3:3)"));
  const auto [q, q_notes] = read_with_notes("dist:\n  mode: fsdp\n  reduce_dtype: bf16\n", {"dist.reduce_quant=int8"});
  CHECK(q.dist.reduce_dtype == DType::f32);
  REQUIRE(q_notes.size() == 1);
  CHECK_THAT(q_notes[0], HasSubstr("--set dist.reduce_quant=int8: dropped the file's dist.reduce_dtype (switch.yaml:3:3)"));

  // data.dataset: CIFAR-100's coarse labels, and a resize, which image_folder does not take.
  CHECK_THAT(read_with_notes("data:\n  dataset: cifar100\n  root: /x\n  label: coarse\n", {"data.dataset=cifar10"})
                 .second.at(0),
             HasSubstr("--set data.dataset=cifar10: dropped the file's data.label (switch.yaml:4:3)"));
  const auto [f, f_notes] = read_with_notes("data:\n  dataset: cifar10\n  root: /x\n  resize: 64\n",
                                            {"data.dataset=image_folder"});
  CHECK(f.data.resize == 0);
  REQUIRE(f_notes.size() == 1);
  CHECK_THAT(f_notes[0], HasSubstr("dropped the file's data.resize (switch.yaml:4:3)"));
  // data.val_paths given: the file's val_fraction does not apply.
  const auto [v, v_notes] = read_with_notes("data:\n  dataset: text\n  paths: [a]\n  tokenizer: t\n  val_fraction: 0.1\n"
                                            "  seq_len: 16\nmodel:\n  name: llama\n",
                                            {"data.val_paths=[b]"});
  CHECK(v.data.text.val_fraction == 0.0);
  REQUIRE(v_notes.size() == 1);
  CHECK_THAT(v_notes[0], HasSubstr("--set data.val_paths=[b]: dropped the file's data.val_fraction (switch.yaml:5:3)"));

  // A grad_pipeline entry's carrier and g_w bits: fast accumulation is the fp8 carrier's, ACBP needs a quantised g_w.
  const auto [g, g_notes] = read_with_notes(
      "grad_pipeline:\n  default:\n    name: hlq\n    fp8_accumulation: fast\n    acbp_bits: 4\n",
      {"grad_pipeline.default.carrier=int8", "grad_pipeline.default.gw_bits=0"});
  REQUIRE(g_notes.size() == 1);
  CHECK_THAT(g_notes[0], HasSubstr("dropped the file's grad_pipeline.default.fp8_accumulation (switch.yaml:4:5) and "
                                   "grad_pipeline.default.acbp_bits (switch.yaml:5:5)"));

  // Keys of another section: optim.layer_decay is ViT's, train.label_smoothing gives way to data.mix. The note names
  // the --set that decided it, not every --set given.
  const auto [l, l_notes] = read_with_notes("model:\n  name: vit\noptim:\n  name: adamw\n  layer_decay: 0.65\n",
                                            {"run.name=x", "model.name=resnet18"});
  CHECK(l.optim.layer_decay == 1.0);
  REQUIRE(l_notes.size() == 1);
  CHECK(l_notes[0] == "--set model.name=resnet18: dropped the file's optim.layer_decay (switch.yaml:5:3): it applies "
                      "to the file's own model.name settings only");
  const auto [s, s_notes] = read_with_notes("train:\n  label_smoothing: 0.1\n", {"data.mix.mixup_alpha=0.8"});
  CHECK(s.train.label_smoothing == 0.0);
  REQUIRE(s_notes.size() == 1);
  CHECK(s_notes[0] == "--set data.mix.mixup_alpha=0.8: dropped the file's train.label_smoothing (switch.yaml:2:3): it "
                      "applies to the file's own data.mix settings only");
  // A --set that changes nothing such a key depends on drops nothing.
  CHECK(read_with_notes("model:\n  name: vit\noptim:\n  name: adamw\n  layer_decay: 0.65\n", {"optim.lr=0.1"})
            .second.empty());

  // Still errors: such a key that a --set gives, and one that the file's own choice refuses too.
  CHECK_THAT(error_of([&] { read_with_notes("model:\n  name: resnet18\n", {"model.name=llama", "model.num_classes=10"}); }),
             HasSubstr("--set model.num_classes=10: model.num_classes: does not apply to llama"));
  // (A --set that makes such a file key apply is no switch away from it: nothing to drop.)
  CHECK(read_with_notes("model:\n  name: resnet18\noptim:\n  layer_decay: 0.5\n", {"model.name=vit"}).first.optim.layer_decay ==
        0.5);
  CHECK_THAT(error_of([&] { read_with_notes("model:\n  name: mlp\noptim:\n  layer_decay: 0.5\n", {"model.name=resnet18"}); }),
             HasSubstr("switch.yaml:4:16: optim.layer_decay: layer-wise decay is defined for model.name vit (its "
                       "blocks), not resnet18"));
  CHECK_THAT(error_of([&] { read_with_notes("dist:\n  mode: ddp\n  fsdp_units: [a.]\n", {"dist.timeout_s=5"}); }),
             HasSubstr("switch.yaml:3:15: dist.fsdp_units: applies to dist.mode fsdp only, got mode ddp"));
}

TEST_CASE("a key that applies to another choice is an error unless it holds the value a saved config records",
          "[config]") {
  // Without a --set, an fsdp key under ddp is refused instead of being ignored ...
  CHECK_THAT(error_of([&] { read_with_notes("dist:\n  mode: ddp\n  reshard_after_forward: false\n", {}); }),
             HasSubstr("switch.yaml:3:26: dist.reshard_after_forward: applies to dist.mode fsdp only, got mode ddp"));
  CHECK_THAT(error_of([&] { read_with_notes("dist:\n  mode: fsdp\n  reduce_in_backward: false\n", {}); }),
             HasSubstr("switch.yaml:3:23: dist.reduce_in_backward: applies to dist.mode ddp only, got mode fsdp"));
  // ... but the value a config.yaml saved by a run records for it (every key at its default) passes, so such files
  // run again; it is left out of the resolved config.
  const auto [saved, notes] = read_with_notes(
      "model:\n  name: llama\n  num_classes: 0\n  init_from_reset: []\n"
      "data:\n  dataset: text\n  paths: [a]\n  tokenizer: t\n  seq_len: 16\n"
      "optim:\n  layer_decay: 1.0\n"
      "dist:\n  mode: ddp\n  fsdp_units: []\n  reduce_dtype: f32\n  prefetch: true\n  reshard_after_forward: true\n"
      "  gather_dtype: fp32\n  reduce_quant: none\n  reduce_quant_block: 256\n  reduce_quant_error_every: 100\n",
      {});
  CHECK(notes.empty());
  CHECK(saved.dist.mode == dist::DistMode::ddp);
  CHECK(saved.resolved_yaml.find("fsdp_units") == std::string::npos);
  CHECK(saved.resolved_yaml.find("num_classes") == std::string::npos);
  CHECK(saved.resolved_yaml.find("layer_decay") == std::string::npos);
  // A switch drops such a key even at that value: it belongs to the old choice.
  CHECK_THAT(read_with_notes("dist:\n  mode: fsdp\n  prefetch: true\n", {"dist.mode=none"}).second.at(0),
             HasSubstr("dropped the file's dist.prefetch (switch.yaml:3:3)"));

  // HLQ's rank_pct is rank pct's and rank_rows rank rows' (both were read, and ignored, under any rank).
  const std::string hlq = "grad_pipeline:\n  default:\n    name: hlq\n";
  CHECK_THAT(error_of([&] { read_with_notes(hlq + "    rank: full\n    rank_pct: 25\n", {}); }),
             HasSubstr("switch.yaml:5:15: grad_pipeline.default.rank_pct: applies to rank pct only, got rank full"));
  CHECK_THAT(error_of([&] { read_with_notes(hlq + "    rank_rows: 8\n", {}); }),
             HasSubstr("switch.yaml:4:16: grad_pipeline.default.rank_rows: applies to rank rows only, got rank pct"));
  CHECK(read_with_notes(hlq + "    rank: full\n    rank_pct: 50\n    rank_rows: 1\n", {}).second.empty());
  CHECK_THAT(read_with_notes(hlq + "    rank_pct: 25\n", {"grad_pipeline.default.rank=rows",
                                                         "grad_pipeline.default.rank_rows=8"})
                 .second.at(0),
             HasSubstr("dropped the file's grad_pipeline.default.rank_pct (switch.yaml:4:5)"));
  // The quantised reduce-scatter's block and error check need one.
  CHECK_THAT(error_of([&] { read_with_notes("dist:\n  mode: fsdp\n  reduce_quant_block: 64\n", {}); }),
             HasSubstr("switch.yaml:3:23: dist.reduce_quant_block: applies to a quantised reduce-scatter only"));
  const auto [rq, rq_notes] = read_with_notes("dist:\n  mode: fsdp\n  reduce_quant: int4\n  reduce_quant_block: 64\n"
                                              "  reduce_quant_error_every: 0\n",
                                              {"dist.reduce_quant=none"});
  CHECK(rq.dist.reduce_quant_block == dist::DistOptions{}.reduce_quant_block);
  REQUIRE(rq_notes.size() == 1);
  CHECK_THAT(rq_notes[0], HasSubstr("dropped the file's dist.reduce_quant_block (switch.yaml:4:3) and "
                                    "dist.reduce_quant_error_every (switch.yaml:5:3)"));
}
