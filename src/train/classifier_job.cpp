// The classifier job: an MLP (linear -> activation -> ... -> linear) on flattened images, cross-entropy
// loss, SGD (torch.optim.SGD semantics), spdlog progress lines, JSONL metrics and a per-epoch test evaluation.
// Logging goes through spdlog directly.
#include "hadatrain/train/classifier_job.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/core/error.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/data/mnist.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/train/metrics.h"

namespace ht::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// flatten -> linear -> activation -> ... -> linear, with torch.nn.Sequential names ("1.weight", ...) and
// torch.nn.Linear initialisation: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)), drawn in layer order from gen.
std::shared_ptr<nn::Sequential> make_mlp(const std::vector<int64_t>& widths, Activation act, Generator& gen) {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Flatten>(1));  // (B, C, H, W) -> (B, C*H*W)
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    model->push_back(std::make_shared<nn::Linear>(widths[l], widths[l + 1], nn::Bias::yes, gen));
    if (l + 2 < widths.size())
      model->push_back(std::make_shared<nn::Activation>(act == Activation::gelu ? nn::ActivationKind::gelu
                                                                                : nn::ActivationKind::relu));
  }
  return model;
}

struct EvalResult {
  double loss = 0.0;
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const { return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
};

// Mean cross-entropy and top-1 accuracy over one pass of `dataset` in its stored order.
EvalResult evaluate(nn::Module& model, const std::shared_ptr<const data::Dataset>& dataset,
                    const data::LoaderOptions& opts, DType dtype, Device device) {
  NoGradGuard no_grad;
  model.eval();
  data::DataLoader loader(dataset, opts);
  EvalResult r;
  double loss_sum = 0.0;
  while (const auto batch = loader.next()) {
    const Tensor x = to_dtype(batch->images, dtype).to(device);  // (B, C, H, W)
    const Tensor y = batch->labels.to(device);                    // (B)
    const Tensor logits = model.forward(x);                       // (B, classes)
    loss_sum += cross_entropy(logits, y, {.reduction = Reduction::sum}).item();
    const std::vector<int64_t> predicted = argmax(logits, 1).to_vector<int64_t>();
    const std::vector<int64_t> labels = batch->labels.to_vector<int64_t>();
    for (std::size_t i = 0; i < labels.size(); ++i) r.correct += predicted[i] == labels[i] ? 1 : 0;
    r.total += batch->size();
  }
  model.train();
  r.loss = r.total ? loss_sum / static_cast<double>(r.total) : 0.0;
  return r;
}

void check_device(Device device) {
  if (!device.is_cuda()) return;
  const std::string what = fmt::format("train.device={}", to_string(device));
  require_cuda(what.c_str());
  const int count = cuda_device_count();
  HT_CHECK(device.index < count, "{}: only {} CUDA device(s) are visible", what, count);
}

std::shared_ptr<const data::MnistData> load_split(const DataSection& cfg, data::MnistSplit split) {
  std::error_code ec;
  HT_CHECK(std::filesystem::is_directory(cfg.root, ec),
           "data.root: {} is not a directory (tools/setup.sh installs Fashion-MNIST into "
           "/usr/share/datasets/fashion-mnist; otherwise point data.root at an MNIST-layout directory)",
           cfg.root);
  const int64_t limit = split == data::MnistSplit::train ? cfg.train_limit : cfg.test_limit;
  return std::make_shared<const data::MnistData>(data::load_mnist(cfg.root, split, limit));
}

std::string describe_widths(const std::vector<int64_t>& widths) {
  std::string s;
  for (std::size_t i = 0; i < widths.size(); ++i) s += (i ? "-" : "") + std::to_string(widths[i]);
  return s;
}

}  // namespace

ClassifierJobResult run_classifier_job(const ClassifierJobConfig& cfg) {
  namespace fs = std::filesystem;
  check_device(cfg.train.device);
  const DType dtype = cfg.train.dtype;
  const Device device = cfg.train.device;

  // The run directory: the resolved config next to the metrics.
  std::error_code ec;
  fs::create_directories(cfg.run.out_dir, ec);
  HT_CHECK(!ec, "run.out_dir: cannot create {}: {}", cfg.run.out_dir, ec.message());
  io::write_file_atomic(fs::path(cfg.run.out_dir) / "config.yaml",
                        fmt::format("# Resolved config of run {} ({} with defaults and --set overrides applied)\n{}",
                                    cfg.run.name, cfg.source, cfg.resolved_yaml));
  MetricsLog metrics((fs::path(cfg.run.out_dir) / "metrics.jsonl").string());

  // Data: the loader shuffles per epoch from run.seed (Note [Data randomness]) and normalises.
  const auto train_data = load_split(cfg.data, data::MnistSplit::train);
  const auto test_data = load_split(cfg.data, data::MnistSplit::test);
  const auto train_set = std::make_shared<const data::MnistDataset>(train_data);
  const auto test_set = std::make_shared<const data::MnistDataset>(test_data);
  const data::Normalize norm{{static_cast<float>(cfg.data.normalize_mean)},
                             {static_cast<float>(cfg.data.normalize_std)}};
  const int prefetch = std::max(4, 2 * cfg.data.num_workers);
  data::DataLoader train_loader(train_set, {.batch_size = cfg.data.batch_size,
                                            .num_workers = cfg.data.num_workers,
                                            .prefetch = prefetch,
                                            .seed = cfg.run.seed,
                                            .shuffle = data::Shuffle::on,
                                            .drop_last = data::DropLast::no,
                                            .normalize = norm});
  const data::LoaderOptions eval_opts{.batch_size = cfg.data.eval_batch_size,
                                      .num_workers = cfg.data.num_workers,
                                      .prefetch = prefetch,
                                      .seed = cfg.run.seed,
                                      .shuffle = data::Shuffle::off,
                                      .drop_last = data::DropLast::no,
                                      .normalize = norm};

  // Model and optimiser.
  const Shape& image_shape = train_data->images.shape();  // (N, C, H, W)
  std::vector<int64_t> widths{image_shape[1] * image_shape[2] * image_shape[3]};
  widths.insert(widths.end(), cfg.model.hidden.begin(), cfg.model.hidden.end());
  widths.push_back(data::kMnistClasses);
  Generator gen(cfg.run.seed);
  const auto model = make_mlp(widths, cfg.model.activation, gen);
  model->to(dtype);
  model->to(device);
  std::vector<optim::ParamRef> params = optim::make_param_refs(model->named_parameters());
  for (optim::ParamRef& p : params) p.decay = true;  // as torch.optim.SGD(model.parameters(), weight_decay=...)
  const auto optimizer = optim::make_sgd(params, {.momentum = cfg.optim.momentum,
                                                  .dampening = 0.0,
                                                  .weight_decay = cfg.optim.weight_decay,
                                                  .nesterov = cfg.optim.nesterov});

  spdlog::info("run {}: writing {}", cfg.run.name, cfg.run.out_dir);
  spdlog::info("data: {} from {}, {} train / {} test images, batch size {}", dataset_name(cfg.data.dataset),
               cfg.data.root, train_set->size(), test_set->size(), cfg.data.batch_size);
  spdlog::info("model: mlp {} ({}), {} parameters, {} on {}; optim: sgd lr {:g} momentum {:g}{} weight_decay {:g}",
               describe_widths(widths), activation_name(cfg.model.activation), model->num_parameters(),
               dtype_name(dtype), to_string(device), cfg.optim.lr, cfg.optim.momentum,
               cfg.optim.nesterov ? " (nesterov)" : "", cfg.optim.weight_decay);

  const int64_t steps_per_epoch = train_loader.batches_per_epoch();
  ClassifierJobResult result;
  result.out_dir = cfg.run.out_dir;
  int64_t step = 0;
  for (int64_t epoch = 1; epoch <= cfg.train.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    auto window_start = epoch_start;
    double window_loss = 0.0, epoch_loss = 0.0;
    int64_t window_steps = 0, window_images = 0, epoch_steps = 0;
    while (const auto batch = train_loader.next()) {
      const Tensor x = to_dtype(batch->images, dtype).to(device);  // (B, C, H, W)
      const Tensor y = batch->labels.to(device);                    // (B)
      const Tensor loss = cross_entropy(model->forward(x), y);      // mean over the batch
      optimizer->zero_grad();
      loss.backward();
      optimizer->step(cfg.optim.lr);
      ++step;
      ++epoch_steps;

      const double loss_value = loss.item();
      HT_CHECK(std::isfinite(loss_value), "training diverged at step {} (epoch {}): the loss is {}; lower optim.lr",
               step, epoch, loss_value);
      window_loss += loss_value;
      epoch_loss += loss_value;
      ++window_steps;
      window_images += batch->size();
      if (step == 1 || step % cfg.train.log_every == 0) {
        const double mean_loss = window_loss / static_cast<double>(window_steps);
        const double images_per_s = static_cast<double>(window_images) / std::max(seconds_since(window_start), 1e-9);
        spdlog::info("epoch {}/{} step {} ({}/{}) loss {:.4f} lr {:g} {:.0f} img/s", epoch, cfg.train.epochs, step,
                     batch->position.batch + 1, steps_per_epoch, mean_loss, cfg.optim.lr, images_per_s);
        metrics.write(MetricsRecord("train")
                          .add("step", step)
                          .add("epoch", epoch)
                          .add("loss", mean_loss)
                          .add("lr", cfg.optim.lr)
                          .add("img_per_s", images_per_s));
        window_loss = 0.0;
        window_steps = window_images = 0;
        window_start = Clock::now();
      }
    }
    const double epoch_seconds = seconds_since(epoch_start);
    const double train_loss = epoch_loss / static_cast<double>(std::max<int64_t>(epoch_steps, 1));
    const EvalResult ev = evaluate(*model, test_set, eval_opts, dtype, device);
    spdlog::info("epoch {}/{} done in {:.1f} s: train loss {:.4f}, test loss {:.4f}, test accuracy {:.2f}% ({}/{})",
                 epoch, cfg.train.epochs, epoch_seconds, train_loss, ev.loss, 100.0 * ev.accuracy(), ev.correct,
                 ev.total);
    metrics.write(MetricsRecord("eval")
                      .add("step", step)
                      .add("epoch", epoch)
                      .add("train_loss", train_loss)
                      .add("test_loss", ev.loss)
                      .add("test_acc", ev.accuracy())
                      .add("test_correct", ev.correct)
                      .add("test_total", ev.total)
                      .add("epoch_seconds", epoch_seconds));
    result.test_accuracy = ev.accuracy();
    result.test_loss = ev.loss;
  }
  result.steps = step;
  return result;
}

}  // namespace ht::train
