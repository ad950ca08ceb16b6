// The classifier job's config sections: keys, defaults and ranges (documented in docs/config.md).
#include "hadatrain/train/job_config.h"

#include <filesystem>

namespace ht::train {

std::string dataset_name(DatasetKind d) { return d == DatasetKind::mnist ? "mnist" : "fashion_mnist"; }
std::string activation_name(Activation a) { return a == Activation::gelu ? "gelu" : "relu"; }

RunSection read_run_section(ConfigReader r, const std::string& default_name) {
  RunSection s;
  s.name = r.get<std::string>("name", default_name);
  if (s.name.empty() || s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
                            std::string::npos)
    r.fail("name", fmt::format("expected a non-empty name of letters, digits, '.', '_' or '-', got '{}'", s.name));
  s.out_dir = r.get<std::string>("out_dir", "runs/" + s.name);
  if (s.out_dir.empty()) r.fail("out_dir", "expected a directory path, got an empty string");
  s.seed = r.get<uint64_t>("seed", 0);
  return s;
}

DataSection read_data_section(ConfigReader r) {
  DataSection s;
  s.dataset = r.get_choice("dataset", DatasetKind::fashion_mnist,
                           {{"fashion_mnist", DatasetKind::fashion_mnist}, {"mnist", DatasetKind::mnist}});
  const bool fashion = s.dataset == DatasetKind::fashion_mnist;
  // Fashion-MNIST ships as a Debian package (dataset-fashion-mnist); MNIST has no packaged copy.
  s.root = r.get<std::string>("root", fashion ? "/usr/share/datasets/fashion-mnist" : "");
  if (s.root.empty()) r.fail("root", fmt::format("expected the directory holding the {} IDX files", dataset_name(s.dataset)));
  s.batch_size = r.get<int64_t>("batch_size", 64, Range::at_least(1));
  s.eval_batch_size = r.get<int64_t>("eval_batch_size", 1000, Range::at_least(1));
  s.num_workers = r.get("num_workers", 1, Range::closed(0, 64));
  s.train_limit = r.get<int64_t>("train_limit", 0, Range::non_negative());
  s.test_limit = r.get<int64_t>("test_limit", 0, Range::non_negative());
  // Per-pixel statistics of the training set, on the [0, 1] scale.
  ConfigReader norm = r.child("normalize");
  s.normalize_mean = norm.get("mean", fashion ? 0.28604 : 0.1307);
  s.normalize_std = norm.get("std", fashion ? 0.35302 : 0.3081, Range::positive());
  return s;
}

MlpSection read_mlp_section(ConfigReader r) {
  MlpSection s;
  s.name = r.get_enum("name", "mlp", {"mlp"});
  s.hidden = r.get_list<int64_t>("hidden", {256, 128}, Range::at_least(1));
  s.activation = r.get_choice("activation", Activation::relu, {{"relu", Activation::relu}, {"gelu", Activation::gelu}});
  return s;
}

SgdSection read_sgd_section(ConfigReader r) {
  SgdSection s;
  s.name = r.get_enum("name", "sgd", {"sgd"});
  s.lr = r.get("lr", 0.05, Range::positive());
  s.momentum = r.get("momentum", 0.9, Range::half_open(0.0, 1.0));
  s.nesterov = r.get("nesterov", false);
  if (s.nesterov && s.momentum == 0.0) r.fail("nesterov", "nesterov momentum needs optim.momentum > 0");
  s.weight_decay = r.get("weight_decay", 0.0, Range::non_negative());
  return s;
}

TrainSection read_train_section(ConfigReader r) {
  TrainSection s;
  s.epochs = r.get<int64_t>("epochs", 3, Range::at_least(1));
  s.log_every = r.get<int64_t>("log_every", 100, Range::at_least(1));
  const std::string device = r.get<std::string>("device", "cpu");
  try {
    s.device = parse_device(device);
  } catch (const Error&) {
    r.fail("device", fmt::format("expected cpu, cuda or cuda:N, got {}", device));
  }
  s.dtype = r.get_choice("dtype", DType::f32, {{"f32", DType::f32}, {"f64", DType::f64}});
  return s;
}

ClassifierJobConfig read_classifier_job_config(ConfigReader root) {
  ClassifierJobConfig c;
  c.source = root.source();
  c.run = read_run_section(root.child("run"), std::filesystem::path(root.source()).stem().string());
  c.data = read_data_section(root.child("data"));
  c.model = read_mlp_section(root.child("model"));
  c.optim = read_sgd_section(root.child("optim"));
  c.train = read_train_section(root.child("train"));
  root.finish();
  c.resolved_yaml = root.resolved_yaml();
  return c;
}

ClassifierJobConfig load_classifier_job_config(const std::string& path, const std::vector<std::string>& overrides) {
  return read_classifier_job_config(ConfigReader::load_file(path, overrides));
}

}  // namespace ht::train
