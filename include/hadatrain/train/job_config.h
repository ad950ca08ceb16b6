// The typed config of the classifier job (`hadatrain train`): one struct per YAML section, each with its
// own reader, so later jobs (the vision trainer) can reuse the sections they share and add their own.
// Every key, type, default and range is listed in docs/config.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hadatrain/tensor/device.h"
#include "hadatrain/tensor/dtype.h"
#include "hadatrain/train/config_reader.h"

namespace ht::train {

// run: what the run is called, where it writes, how it is seeded.
struct RunSection {
  std::string name;     // default: the config file's stem
  std::string out_dir;  // default: runs/<name>
  uint64_t seed = 0;    // seeds parameter initialisation and data shuffling
};

enum class DatasetKind { fashion_mnist, mnist };

// data: an IDX image-classification dataset (MNIST layout) and how batches are made.
struct DataSection {
  DatasetKind dataset = DatasetKind::fashion_mnist;
  std::string root;             // directory holding train-images-idx3-ubyte[.gz] etc.
  int64_t batch_size = 64;
  int64_t eval_batch_size = 1000;
  int num_workers = 1;          // loader threads assembling batches (0 = in the training thread)
  int64_t train_limit = 0;      // use only the first N training images (0 = all)
  int64_t test_limit = 0;       // use only the first N test images (0 = all)
  double normalize_mean = 0.0;  // x = (pixel / 255 - mean) / std
  double normalize_std = 1.0;
};

enum class Activation { relu, gelu };

// model: a multi-layer perceptron over flattened images.
struct MlpSection {
  std::string name = "mlp";
  std::vector<int64_t> hidden{256, 128};  // hidden layer widths (may be empty: a linear classifier)
  Activation activation = Activation::relu;
};

// optim: SGD with torch.optim.SGD semantics (optim/optimizer.h); weight decay applies to every parameter.
struct SgdSection {
  std::string name = "sgd";
  double lr = 0.05;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
};

// train: the loop.
struct TrainSection {
  int64_t epochs = 3;
  int64_t log_every = 100;  // steps between log lines and JSONL train records
  Device device = Device::cpu();
  DType dtype = DType::f32;
};

struct ClassifierJobConfig {
  RunSection run;
  DataSection data;
  MlpSection model;
  SgdSection optim;
  TrainSection train;
  std::string source;         // the config file
  std::string resolved_yaml;  // the whole config after defaults and overrides (saved with the run)
};

// Section readers: each reads the keys of its section (defaults applied, ranges checked).
RunSection read_run_section(ConfigReader r, const std::string& default_name);
DataSection read_data_section(ConfigReader r);
MlpSection read_mlp_section(ConfigReader r);
SgdSection read_sgd_section(ConfigReader r);
TrainSection read_train_section(ConfigReader r);

// Reads every section from `root`, rejects unknown keys and records the resolved YAML. The run name
// defaults to the stem of root.source().
ClassifierJobConfig read_classifier_job_config(ConfigReader root);
// load_file(path, overrides) + read_classifier_job_config.
ClassifierJobConfig load_classifier_job_config(const std::string& path, const std::vector<std::string>& overrides = {});

std::string dataset_name(DatasetKind d);
std::string activation_name(Activation a);

}  // namespace ht::train
