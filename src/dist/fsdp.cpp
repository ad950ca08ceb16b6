// Sharded data parallelism (dist/fsdp.h, Note [Sharded parameters]).
#include "hadatrain/dist/fsdp.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hadatrain/autograd/function.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/core/error.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"

namespace ht::dist {

// The model store's policy: gathers a parameter's unit on first use in a step and hands out the gathered
// tensor with a backward that reduce-scatters into the shard.
class FsdpPolicy final : public nn::MaterialisePolicy {
 public:
  explicit FsdpPolicy(FullyShardedModel& m) : m_(m), gathered_(m.params_.size()), pending_(m.unit_count_) {}

  Tensor materialise(const nn::MaterialiseRequest& r) override {
    const FullyShardedModel::Param& p = m_.params_[r.index];
    ensure_gathered(p.unit);
    if (m_.options_.prefetch && p.unit + 1 < m_.unit_count_) issue(p.unit + 1);
    // (shape) in the master dtype; its gradient goes to the shard through a reduce-scatter
    Tensor full = gathered_[r.index].narrow(0, 0, p.numel).view(p.shape).detach();
    FullyShardedModel* m = &m_;
    const std::size_t i = r.index;
    record("FsdpGatherBackward", {&p.shard}, full, [m, i](FunctionNode&, std::vector<Tensor>&& grads) {
      return std::vector<Tensor>{m->policy_->reduce_scatter_grad(i, grads[0])};
    });
    return nn::cast_master(full, r.dtype);
  }

  // The gradient of parameter i's full tensor -> this rank's chunk of the share-weighted sum over ranks.
  Tensor reduce_scatter_grad(std::size_t i, const Tensor& g_full) {
    const FullyShardedModel::Param& p = m_.params_[i];
    const Tensor weighted = mul(g_full.reshape({p.numel}).to(DType::f32), m_.share_);
    if (m_.defer_) {  // accumulate locally; reduce_deferred() communicates once per step
      Tensor& acc = m_.deferred_[i];
      if (acc.defined()) add_(acc, weighted);
      else acc = weighted.clone();
      return zeros({p.chunk}, {p.shard.dtype(), m_.comm_.device()});
    }
    return scatter(p, weighted);
  }

  // This rank's chunk of the sum over ranks of `weighted` (parameter p's flat share-weighted gradient).
  Tensor scatter(const FullyShardedModel::Param& p, const Tensor& weighted) {
    const int n = m_.comm_.size();
    Tensor flat = zeros({p.chunk * n}, {m_.options_.reduce_dtype, m_.comm_.device()});  // (N * chunk)
    copy_(flat.narrow(0, 0, p.numel), weighted.to(m_.options_.reduce_dtype));
    Tensor chunk = zeros({p.chunk}, {m_.options_.reduce_dtype, m_.comm_.device()});
    m_.bytes_ += static_cast<int64_t>(flat.nbytes());
    m_.comm_.reduce_scatter(flat, chunk, ReduceOp::sum)->wait();
    return chunk.to(p.shard.dtype());
  }

  void reset() {
    for (auto& g : gathered_) g = Tensor();
    for (auto& u : pending_) u.clear();
  }

 private:
  struct InFlight {
    std::size_t param;
    std::unique_ptr<Work> work;
  };
  // Issues the all-gathers of every parameter of `unit` not yet gathered or in flight.
  void issue(std::size_t unit) {
    if (!pending_[unit].empty()) return;
    const int n = m_.comm_.size();
    for (std::size_t i = 0; i < m_.params_.size(); ++i) {
      const FullyShardedModel::Param& p = m_.params_[i];
      if (p.unit != unit || gathered_[i].defined()) continue;
      Tensor out = empty({p.chunk * n}, {p.shard.dtype(), m_.comm_.device()});  // (N * chunk) padded flat
      gathered_[i] = out;
      m_.bytes_ += static_cast<int64_t>(p.shard.nbytes());
      pending_[unit].push_back({i, m_.comm_.all_gather(p.shard.detach(), out)});
    }
    if (pending_[unit].empty()) pending_[unit].push_back({m_.params_.size(), nullptr});  // nothing to wait for
  }
  void ensure_gathered(std::size_t unit) {
    issue(unit);
    for (auto& f : pending_[unit])
      if (f.work) {
        f.work->wait();
        f.work.reset();
      }
  }

  FullyShardedModel& m_;
  std::vector<Tensor> gathered_;               // per parameter: the padded flat full tensor, once issued
  std::vector<std::vector<InFlight>> pending_;  // per unit: its gathers (waited ones have no work left)
};

FullyShardedModel::FullyShardedModel(Communicator& comm, std::shared_ptr<nn::ParameterStore> model_store,
                                     FsdpOptions options)
    : comm_(comm), model_store_(std::move(model_store)), options_(std::move(options)) {
  HT_CHECK(options_.reduce_dtype == DType::f32 || options_.reduce_dtype == DType::bf16,
           "dist.reduce_dtype: expected f32 or bf16, got {}", dtype_name(options_.reduce_dtype));
  const int n = comm_.size(), r = comm_.rank();
  share_ = 1.0 / n;
  std::map<std::string, std::size_t> unit_of_prefix;
  params_.reserve(model_store_->size());
  for (const nn::ParamRef& ref : model_store_->params()) {
    Tensor& slot = *ref.param;
    HT_CHECK(slot.device() == comm_.device(), "fsdp: parameter '{}' is on {} but the {} communicator works on {}",
             ref.name, to_string(slot.device()), comm_.engine(), to_string(comm_.device()));
    // Every rank starts from rank 0's values.
    Tensor whole = slot.detach().contiguous().clone();
    comm_.broadcast(whole, 0)->wait();
    Param p;
    p.name = ref.name;
    p.shape = slot.shape();
    p.numel = slot.numel();
    p.chunk = (p.numel + n - 1) / n;
    std::string key = ref.name;  // the unit: the first prefix that matches, else the parameter alone
    for (const auto& u : options_.units)
      if (ref.name.rfind(u, 0) == 0) {
        key = "unit:" + u;
        break;
      }
    const auto [it, added] = unit_of_prefix.emplace(key, unit_count_);
    if (added) ++unit_count_;
    p.unit = it->second;
    Tensor padded = zeros({p.chunk * n}, {slot.dtype(), slot.device()});
    copy_(padded.narrow(0, 0, p.numel), whole.reshape({p.numel}));
    p.shard = padded.narrow(0, r * p.chunk, p.chunk).clone();
    p.shard.set_requires_grad(true);
    params_.push_back(std::move(p));
    // The module keeps no unsharded copy: a zero-element tensor of the master dtype holds the slot.
    slot = empty({0}, {whole.dtype(), whole.device()});
  }
  std::vector<nn::ParamRef> refs;
  for (std::size_t i = 0; i < params_.size(); ++i)
    refs.push_back({params_[i].name, &params_[i].shard, model_store_->params()[i].decay,
                    model_store_->params()[i].lr_scale});
  shards_ = std::make_shared<nn::ParameterStore>(std::move(refs));
  deferred_.resize(params_.size());
  policy_ = std::make_shared<FsdpPolicy>(*this);
  model_store_->set_policy(policy_);
}

FullyShardedModel::~FullyShardedModel() = default;

void FullyShardedModel::set_share(double share) { share_ = share; }

void FullyShardedModel::reduce_deferred() {
  NoGradGuard no_grad;
  // Every rank has a buffer for the same parameters (the same model runs on every rank's micro-batches),
  // so the collectives match; a parameter no micro-batch used has none on any rank.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!deferred_[i].defined()) continue;
    Param& p = params_[i];
    const Tensor chunk = policy_->scatter(p, deferred_[i]);
    if (p.shard.grad().defined()) add_(p.shard.grad(), chunk);
    else p.shard.set_grad(chunk);
    deferred_[i] = Tensor();
  }
}

void FullyShardedModel::end_step() {
  policy_->reset();
  bytes_ = 0;
}

double FullyShardedModel::clip_grad_norm(double max_norm) {
  double local = 0.0;
  for (const Param& p : params_)
    if (p.shard.grad().defined()) {
      const Tensor g = p.shard.grad().to(DType::f64);
      local += sum(mul(g, g)).item();
    }
  Tensor total = full({1}, local, {DType::f64, comm_.device()});
  comm_.all_reduce(total, ReduceOp::sum)->wait();
  const double norm = std::sqrt(total.item());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const Param& p : params_)
      if (p.shard.grad().defined()) mul_(p.shard.grad(), scale);
  }
  return norm;
}

std::map<std::string, Tensor> FullyShardedModel::full_state() const {
  std::map<std::string, Tensor> out;
  for (const Param& p : params_) {
    Tensor all = empty({p.chunk * comm_.size()}, {p.shard.dtype(), comm_.device()});
    comm_.all_gather(p.shard.detach(), all)->wait();
    out.emplace(p.name, all.narrow(0, 0, p.numel).view(p.shape).clone());
  }
  return out;
}

void FullyShardedModel::load_full_state(const std::map<std::string, Tensor>& state) {
  const int n = comm_.size(), r = comm_.rank();
  NoGradGuard no_grad;
  for (Param& p : params_) {
    const auto it = state.find(p.name);
    HT_CHECK(it != state.end(), "fsdp: the state has no parameter '{}'", p.name);
    HT_CHECK(it->second.shape() == p.shape, "fsdp: '{}' is {} in the state but {} in the model", p.name,
             it->second.describe(), to_string(p.shape));
    Tensor padded = zeros({p.chunk * n}, {p.shard.dtype(), p.shard.device()});
    copy_(padded.narrow(0, 0, p.numel), it->second.reshape({p.numel}).to(p.shard.device()).to(p.shard.dtype()));
    copy_(p.shard, padded.narrow(0, r * p.chunk, p.chunk));
  }
  policy_->reset();
}

std::map<std::string, Tensor> FullyShardedModel::full_optimizer_state() const {
  std::map<std::string, Tensor> out;
  const int n = comm_.size();
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (std::size_t k = 0; k < shards_->state_names().size(); ++k) {
      const Tensor& s = shards_->state(i, k);
      if (!s.defined()) continue;
      Tensor all = empty({params_[i].chunk * n}, {s.dtype(), comm_.device()});
      comm_.all_gather(s.contiguous(), all)->wait();
      out.emplace(params_[i].name + "." + shards_->state_names()[k],
                  all.narrow(0, 0, params_[i].numel).view(params_[i].shape).clone());
    }
  return out;
}

void FullyShardedModel::load_full_optimizer_state(const std::map<std::string, Tensor>& state) {
  shards_->load_state_tensors(shard_optimizer_state(state));
}

std::map<std::string, Tensor> FullyShardedModel::shard_optimizer_state(const std::map<std::string, Tensor>& state) const {
  const int n = comm_.size(), r = comm_.rank();
  std::map<std::string, Tensor> shards;
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (const std::string& slot : shards_->state_names()) {
      const auto it = state.find(params_[i].name + "." + slot);
      if (it == state.end()) continue;
      const Param& p = params_[i];
      HT_CHECK(it->second.numel() == p.numel, "fsdp: optimiser state '{}' is {} but the parameter is {}", it->first,
               it->second.describe(), to_string(p.shape));
      Tensor padded = zeros({p.chunk * n}, {it->second.dtype(), p.shard.device()});
      copy_(padded.narrow(0, 0, p.numel), it->second.reshape({p.numel}).to(p.shard.device()));
      shards.emplace(it->first, padded.narrow(0, r * p.chunk, p.chunk).clone());
    }
  return shards;
}

void FullyShardedModel::save_sharded(const std::filesystem::path& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  HT_CHECK(!ec, "fsdp: cannot create the checkpoint folder {}: {}", dir.string(), ec.message());
  io::TensorList tensors;
  nlohmann::json shapes = nlohmann::json::object();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    tensors.emplace_back("model/" + p.name, p.shard.detach());
    shapes["model/" + p.name] = p.shape.vec();
    for (std::size_t k = 0; k < shards_->state_names().size(); ++k) {
      const Tensor& s = shards_->state(i, k);
      if (!s.defined()) continue;
      const std::string key = "optim/" + p.name + "." + shards_->state_names()[k];
      tensors.emplace_back(key, s);
      shapes[key] = p.shape.vec();
    }
  }
  const nlohmann::json meta = {{"world_size", comm_.size()}, {"rank", comm_.rank()}, {"shapes", shapes}};
  io::save_safetensors(dir / fmt::format("shard-{}-of-{}.safetensors", comm_.rank(), comm_.size()), tensors,
                       {{"hadatrain_fsdp", meta.dump()}});
}

ConsolidatedState consolidate_sharded(const std::filesystem::path& dir) {
  int world = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    int r = 0, n = 0;
    if (std::sscanf(e.path().filename().string().c_str(), "shard-%d-of-%d.safetensors", &r, &n) == 2) world = n;
  }
  HT_CHECK(!ec && world > 0, "fsdp: {} holds no shard-<rank>-of-<N>.safetensors files{}", dir.string(),
           ec ? ": " + ec.message() : "");
  std::vector<io::SafetensorsContents> files;
  nlohmann::json shapes;
  for (int r = 0; r < world; ++r) {
    const auto path = dir / fmt::format("shard-{}-of-{}.safetensors", r, world);
    HT_CHECK(std::filesystem::exists(path), "fsdp: the sharded checkpoint {} lacks {} (it was written by {} ranks)",
             dir.string(), path.filename().string(), world);
    files.push_back(io::load_safetensors(path));
    const auto it = files.back().metadata.find("hadatrain_fsdp");
    HT_CHECK(it != files.back().metadata.end(), "fsdp: {} has no hadatrain_fsdp metadata", path.string());
    const auto meta = nlohmann::json::parse(it->second);
    HT_CHECK(meta.at("world_size").get<int>() == world && meta.at("rank").get<int>() == r,
             "fsdp: {} says rank {} of {}", path.string(), meta.at("rank").get<int>(), meta.at("world_size").get<int>());
    if (r == 0) shapes = meta.at("shapes");
  }
  ConsolidatedState out;
  out.world_size = world;
  for (const auto& [key, shape_json] : shapes.items()) {
    const Shape shape(shape_json.get<std::vector<int64_t>>());
    std::vector<Tensor> chunks;
    for (int r = 0; r < world; ++r) chunks.push_back(files[r].at(key));
    Tensor joined = cat(chunks, 0);
    const int64_t numel = numel_of(shape);
    HT_CHECK(joined.numel() >= numel, "fsdp: the shards of '{}' hold {} elements, fewer than its shape {}", key,
             joined.numel(), to_string(shape));
    Tensor whole = joined.narrow(0, 0, numel).contiguous().view(shape);
    if (key.rfind("model/", 0) == 0) out.model.emplace(key.substr(6), whole);
    else out.optimizer.emplace(key.substr(6), whole);
  }
  return out;
}

}  // namespace ht::dist
