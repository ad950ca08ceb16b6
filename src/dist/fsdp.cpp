// Sharded data parallelism (dist/fsdp.h, Note [Sharded parameters]).
#include "hadatrain/dist/fsdp.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hadatrain/autograd/function.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/core/error.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/allocator.h"
#include "hadatrain/tensor/factory.h"
#include "fsdp_lowp.h"

namespace ht::dist {

// The backward of one materialise: the gradient of the gathered tensor goes to the shard through a
// reduce-scatter (FsdpPolicy::reduce_scatter_grad). With reshard_after_forward it also drives the re-gathering
// in backward (Note [Resharding after forward] in fsdp.h).
class FsdpGatherNode final : public Node {
 public:
  FsdpGatherNode(std::shared_ptr<FsdpPolicy> policy, std::size_t param);
  ~FsdpGatherNode() override;
  std::string name() const override { return "FsdpGatherBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;

 private:
  std::weak_ptr<FsdpPolicy> policy_;
  std::size_t param_;
  uint64_t generation_;
  bool ran_ = false;
};

// The model store's policy: gathers a parameter's unit on first use and hands out the gathered tensor with
// a backward that reduce-scatters into the shard; frees and re-gathers units (Note [Resharding after
// forward]).
class FsdpPolicy final : public nn::MaterialisePolicy, public std::enable_shared_from_this<FsdpPolicy> {
 public:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  explicit FsdpPolicy(FullyShardedModel& m)
      : m_(m), gathered_(m.params_.size()), casts_(m.params_.size()), users_(m.params_.size()),
        unit_params_(m.unit_count_), pending_(m.unit_count_), entered_(m.unit_count_, 0) {
    for (std::size_t i = 0; i < m.params_.size(); ++i) unit_params_[m.params_[i].unit].push_back(i);
  }

  Tensor materialise(const nn::MaterialiseRequest& r) override {
    const FullyShardedModel::Param& p = m_.params_[r.index];
    const bool node = needs_grad({&p.shard});  // a trainable parameter read with grad mode on
    if (!backward_) enter_forward_unit(p.unit, node);
    ensure_gathered(p.unit);
    // (a unit this forward has run already, e.g. the embedding when a tied head reads it, is not needed next)
    if (m_.options_.prefetch && !backward_ && p.unit + 1 < m_.unit_count_ && !entered_[p.unit + 1]) issue(p.unit + 1);
    Tensor out = compute_copy(r.index, r.dtype);  // (shape) in r.dtype, sharing the gathered memory
    m_.lowp_->attach_codes(r.index, out);          // an 8-bit gather's codes for a halo layer's Q(W·H̃)
    if (node) {
      connect(std::make_shared<FsdpGatherNode>(shared_from_this(), r.index), {&p.shard}, {&out});
      if (!backward_ && !order_.empty() && order_.back().first_param == npos) order_.back().first_param = r.index;
      if (!backward_) release_deferred();
    } else if (!backward_ && grad_enabled() && !order_.empty()) {
      order_.back().frozen_read = true;
    }
    return out;
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
    if (m_.lowp_->quantized_reduce()) {  // block codes through an all-to-all (dist/comm_quant.h)
      Tensor flat = zeros({p.chunk * n}, {DType::f32, m_.comm_.device()});  // (N * chunk)
      copy_(flat.narrow(0, 0, p.numel), weighted);
      return m_.lowp_->reduce_scatter(flat, m_.bytes_).to(p.shard.dtype());
    }
    Tensor flat = zeros({p.chunk * n}, {m_.options_.reduce_dtype, m_.comm_.device()});  // (N * chunk)
    copy_(flat.narrow(0, 0, p.numel), weighted.to(m_.options_.reduce_dtype));
    Tensor chunk = zeros({p.chunk}, {m_.options_.reduce_dtype, m_.comm_.device()});
    m_.bytes_ += static_cast<int64_t>(flat.nbytes());
    m_.comm_.reduce_scatter(flat, chunk, ReduceOp::sum)->wait();
    return chunk.to(p.shard.dtype());
  }

  // FsdpGatherNode's apply for parameter i: backward has reached a reader of it.
  Tensor backward(std::size_t i, const Tensor& g, uint64_t generation) {
    if (generation != generation_) return g.defined() ? reduce_scatter_grad(i, g) : Tensor();  // a graph of an ended step
    backward_ = true;
    --users_[i];
    if (m_.options_.reshard_after_forward) gather_ahead(i);
    Tensor out = g.defined() ? reduce_scatter_grad(i, g) : Tensor();
    // Every reader of the gathered tensor is an input of this node's readers, so all of them have run.
    if (m_.options_.reshard_after_forward && users_[i] == 0) release_param(i);
    return out;
  }
  uint64_t node_made(std::size_t i) {
    ++users_[i];
    ++live_nodes_;
    return generation_;
  }
  void node_gone(std::size_t i, bool ran, uint64_t generation) {
    if (generation != generation_) return;
    if (!ran) --users_[i];
    // The graph is gone: the next materialise begins a forward.
    if (--live_nodes_ == 0) backward_ = false, clear_order();
  }

  void reset() {
    for (auto& u : pending_) wait_all(u);
    for (auto& g : gathered_) g = Tensor();
    for (auto& c : casts_) c.clear();
    for (std::size_t i = 0; i < gathered_.size(); ++i) m_.lowp_->drop_codes(i);
    std::fill(users_.begin(), users_.end(), 0);
    ++generation_;  // gather nodes of graphs still alive no longer count
    live_nodes_ = 0;
    backward_ = false;
    current_ = npos;
    clear_order();
  }

  int64_t bytes_alive() const {
    int64_t b = 0;
    auto add = [&b](const Tensor& t) {
      if (t.defined() && t.storage()->data.get() != nullptr) b += static_cast<int64_t>(t.storage()->nbytes);
    };
    for (std::size_t i = 0; i < gathered_.size(); ++i) {
      add(gathered_[i]);
      for (const Tensor& c : casts_[i]) add(c);
    }
    return b;
  }
  int64_t peak = 0;  // the high-water mark of bytes_alive(), taken after every allocation

 private:
  static bool live(const Tensor& t) { return t.defined() && t.storage()->data.get() != nullptr; }
  static void wait_all(std::vector<std::unique_ptr<Work>>& flights) {
    for (auto& w : flights) w->wait();
    flights.clear();
  }
  void note_allocation() { peak = std::max(peak, bytes_alive()); }

  // Issues the all-gathers of the parameters of `unit` that are neither gathered nor in flight. A parameter
  // whose memory was freed (release_param) is gathered again into the same storage, which its readers' saved
  // tensors still share.
  void issue(std::size_t unit) {
    const int n = m_.comm_.size();
    bool allocated = false;
    for (const std::size_t i : unit_params_[unit]) {
      const FullyShardedModel::Param& p = m_.params_[i];
      if (live(gathered_[i])) continue;
      if (gathered_[i].defined()) {
        StorageImpl& st = *gathered_[i].storage();
        st.data = allocator_for(m_.comm_.device().type).allocate(st.nbytes, m_.comm_.device());
      } else {
        gathered_[i] = empty({p.chunk * n}, {p.shard.dtype(), m_.comm_.device()});  // (N * chunk) padded flat
      }
      allocated = true;
      mark_written(gathered_[i]);  // Note [Storage versions]: refilled in place by the gather
      pending_[unit].push_back(m_.lowp_->gather(m_.params_, i, gathered_[i], m_.bytes_));
    }
    if (allocated) note_allocation();
  }
  void ensure_gathered(std::size_t unit) {
    issue(unit);
    wait_all(pending_[unit]);
    // Cast copies freed with their parameter are made again (the same cast of the same bits).
    for (const std::size_t i : unit_params_[unit])
      for (Tensor& c : casts_[i]) {
        if (live(c)) continue;
        StorageImpl& st = *c.storage();
        st.data = allocator_for(c.device().type).allocate(st.nbytes, c.device());
        NoGradGuard no_grad;
        copy_(c, full_view(i).to(c.dtype()));
        note_allocation();
      }
  }
  Tensor full_view(std::size_t i) const {
    const FullyShardedModel::Param& p = m_.params_[i];
    return gathered_[i].narrow(0, 0, p.numel).view(p.shape);
  }
  // Parameter i in `dtype`, no history: a view of the gathered tensor in the master dtype, else one cast
  // per dtype and gather (as cast_master casts), kept with the gathered tensor.
  Tensor compute_copy(std::size_t i, DType dtype) {
    const Tensor full = full_view(i);
    if (dtype == full.dtype()) return full.detach();
    for (const Tensor& c : casts_[i])
      if (c.dtype() == dtype) return c.detach();
    NoGradGuard no_grad;
    casts_[i].push_back(full.to(dtype));
    note_allocation();
    return casts_[i].back().detach();
  }

  // Frees the memory of parameter i's gathered tensor and its casts; the storages stay (the readers' saved
  // tensors hold them) and are filled again by issue.
  void release_param(std::size_t i) {
    wait_all(pending_[m_.params_[i].unit]);  // a gather in flight still writes into it
    if (gathered_[i].defined()) gathered_[i].storage()->data.reset();
    for (Tensor& c : casts_[i]) c.storage()->data.reset();
    m_.lowp_->drop_codes(i);
  }
  void release_unit(std::size_t unit) {
    for (const std::size_t i : unit_params_[unit]) release_param(i);
  }
  // Forward: the first read of a unit other than the current one ends the current unit's forward; with
  // reshard_after_forward its gathered memory is freed. The units are recorded in the order they run.
  void clear_order() {
    order_.clear();
    deferred_.clear();
    std::fill(entered_.begin(), entered_.end(), 0);
    backward_pos_ = npos;
  }
  // `node`: the read that enters `unit` makes a gather node. Frozen parameters (Note [Resharding after
  // forward]): a unit left after reading only frozen parameters with grad mode on stays gathered (its readers
  // may have saved its weights for their input gradients, a norm's scale, and no gather node of its own drives
  // a gather in backward); a unit left by a frozen read with grad mode on is freed only at the next gather
  // node's read (release_deferred): that node's entry gathers it again in backward (gather_ahead), and with no
  // such read (the forward's top units are frozen) it stays gathered for the backward.
  void enter_forward_unit(std::size_t unit, bool node) {
    if (unit == current_) return;
    const bool keep = !order_.empty() && order_.back().unit == current_ && frozen_only(order_.back());
    if (m_.options_.reshard_after_forward && current_ != npos && !keep) {
      if (!node && grad_enabled()) deferred_.push_back(current_);
      else release_unit(current_), release_deferred();
    }
    current_ = unit;
    if (order_.size() >= 4 * m_.unit_count_ + 4) clear_order();  // forwards without backward (evaluation)
    order_.push_back({unit, npos, false});
    entered_[unit] = 1;
  }
  // The backward has reached entry k: the entries above it are done (their readers' input gradients are
  // inputs of k's). Their units' frozen parameters, which no gather node frees, are freed, unless the unit
  // is entered again at or below k (a tied embedding), where it is still to be read.
  void release_frozen_above(std::size_t k) {
    const std::size_t top = std::min(backward_pos_, order_.size() - 1);
    for (std::size_t j = k + 1; j <= top; ++j) {
      const std::size_t u = order_[j].unit;
      bool again = false;
      for (std::size_t b = 0; b <= k && !again; ++b) again = order_[b].unit == u;
      if (again) continue;
      for (const std::size_t i : unit_params_[u])
        if (!m_.params_[i].shard.requires_grad()) release_param(i);
    }
  }
  void release_deferred() {
    for (const std::size_t u : deferred_)
      if (u != current_) release_unit(u);
    deferred_.clear();
  }
  // Backward has reached a reader of parameter i (Note [Resharding after forward]). Its unit's entry in the
  // forward's order is found from where the backward is; the entry below it (the unit the forward ran before)
  // is gathered when the entry's first-read parameter has its gradient (its layer, the first of the unit, is
  // done: the unit's backward is over), and issued early with prefetch when the entry's backward starts. An
  // entry read with grad mode off (activation checkpointing: the recompute reads it again) has no first-read
  // parameter; the entry below it is gathered when its backward starts.
  void gather_ahead(std::size_t i) {
    const std::size_t unit = m_.params_[i].unit;
    if (order_.empty()) return;
    std::size_t k = std::min(backward_pos_, order_.size() - 1) + 1;
    while (k-- > 0)
      if (order_[k].unit == unit) break;
    if (k == npos) return;  // a late reader of a unit the backward has passed
    const bool starts = k != backward_pos_;
    if (starts) release_frozen_above(k);
    backward_pos_ = k;
    if (k == 0) return;
    const Entry& e = order_[k];
    // The entry below, and below each entry that read only frozen parameters (kept gathered, with no gather
    // node to drive this) the next one too, so a unit under frozen-only units is gathered before its backward.
    auto gather_below = [&](bool wait) {
      for (std::size_t j = k; j-- > 0;) {
        if (wait) ensure_gathered(order_[j].unit);
        else issue(order_[j].unit);
        if (!frozen_only(order_[j])) break;
      }
    };
    if (starts && e.first_param == npos) gather_below(true);
    else if (starts && m_.options_.prefetch) gather_below(false);
    if (i == e.first_param) gather_below(true);
  }

  FullyShardedModel& m_;
  std::vector<Tensor> gathered_;                // per parameter: the padded flat full tensor, once issued
  std::vector<std::vector<Tensor>> casts_;      // per parameter: its copies in compute dtypes
  std::vector<int64_t> users_;                  // per parameter: gather nodes whose backward has not run
  std::vector<std::vector<std::size_t>> unit_params_;  // per unit: its parameters
  std::vector<std::vector<std::unique_ptr<Work>>> pending_;  // per unit: its gathers in flight
  uint64_t generation_ = 0;                      // bumped by reset()
  int64_t live_nodes_ = 0;
  bool backward_ = false;                        // a gather node has run since the graph was built
  std::size_t current_ = npos;                   // the unit the forward is in
  struct Entry {
    std::size_t unit;
    std::size_t first_param;   // the first parameter read with a gather node (npos: none)
    bool frozen_read = false;  // a frozen parameter was read with grad mode on
  };
  static bool frozen_only(const Entry& e) { return e.first_param == npos && e.frozen_read; }
  std::vector<Entry> order_;                     // the units in the order the forward entered them
  std::vector<char> entered_;                    // per unit: in order_
  std::vector<std::size_t> deferred_;            // units left by a frozen read, freed at the next node's read
  std::size_t backward_pos_ = npos;              // where in order_ the backward is
};

FsdpGatherNode::FsdpGatherNode(std::shared_ptr<FsdpPolicy> policy, std::size_t param)
    : policy_(policy), param_(param), generation_(policy->node_made(param)) {
}
FsdpGatherNode::~FsdpGatherNode() {
  if (const auto p = policy_.lock()) p->node_gone(param_, ran_, generation_);
}
std::vector<Tensor> FsdpGatherNode::apply(std::vector<Tensor>&& grads) {
  const auto p = policy_.lock();
  HT_CHECK(p != nullptr, "FsdpGatherBackward: the FullyShardedModel of this graph was destroyed before its backward");
  ran_ = true;
  return {p->backward(param_, grads[0], generation_)};
}

namespace {

// Every prefix of FsdpOptions::units (dist.fsdp_units) takes at least one parameter: the first prefix a name
// starts with takes it, so a typo, or a prefix an earlier one covers, would leave its layers silently in units of
// one module each. Checked before any collective, so every rank (the same config) stops alike.
void check_unit_prefixes(const std::vector<nn::ParamRef>& params, const std::vector<std::string>& units) {
  std::vector<bool> takes(units.size(), false);
  for (const nn::ParamRef& ref : params)
    for (std::size_t u = 0; u < units.size(); ++u)
      if (ref.name.rfind(units[u], 0) == 0) {
        takes[u] = true;
        break;
      }
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (takes[u]) continue;
    for (std::size_t e = 0; e < u; ++e)
      HT_CHECK(units[u].rfind(units[e], 0) != 0,
               "dist.fsdp_units: '{}' takes no parameter: the earlier prefix '{}' takes every name it would (list "
               "the longer prefix first)",
               units[u], units[e]);
    HT_CHECK(false,
             "dist.fsdp_units: '{}' is the start of no parameter name of the model ({} parameters, the first '{}'); "
             "a unit is every parameter whose name starts with its prefix",
             units[u], params.size(), params.empty() ? "" : params.front().name);
  }
}

}  // namespace

FullyShardedModel::FullyShardedModel(Communicator& comm, std::shared_ptr<nn::ParameterStore> model_store,
                                     FsdpOptions options)
    : comm_(comm), model_store_(std::move(model_store)), options_(std::move(options)) {
  HT_CHECK(options_.reduce_dtype == DType::f32 || options_.reduce_dtype == DType::bf16,
           "dist.reduce_dtype: expected f32 or bf16, got {}", dtype_name(options_.reduce_dtype));
  const int n = comm_.size(), r = comm_.rank();
  share_ = 1.0 / n;
  lowp_ = std::make_unique<FsdpLowPrecision>(comm_, options_);
  check_unit_prefixes(model_store_->params(), options_.units);
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
    // The unit: the first prefix that matches, else the parameters of the parameter's module (its name without
    // the leaf), so that a layer's weight and bias are gathered and freed together.
    std::string key = "module:" + ref.name.substr(0, ref.name.rfind('.') + 1);
    for (const auto& u : options_.units)
      if (ref.name.rfind(u, 0) == 0) {
        key = "unit:" + u;
        break;
      }
    const auto [it, added] = unit_of_prefix.emplace(key, unit_count_);
    if (added) ++unit_count_;
    p.unit = it->second;
    p.chunk = lowp_->add_param(p.name, p.shape, p.unit, key.rfind("unit:", 0) == 0);  // elements per rank
    Tensor padded = zeros({p.chunk * n}, {slot.dtype(), slot.device()});
    copy_(padded.narrow(0, 0, p.numel), whole.reshape({p.numel}));
    p.shard = padded.narrow(0, r * p.chunk, p.chunk).clone();
    // A frozen parameter (train.freeze, a LoRA base) keeps its shard frozen: it is gathered for the forward
    // but gets no gather node, so no gradient, no reduce-scatter and no optimiser state.
    p.shard.set_requires_grad(slot.requires_grad());
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
  lowp_->end_step();
  bytes_ = 0;
}

int64_t FullyShardedModel::row_quantized_params() const { return lowp_->quantized_params(); }
double FullyShardedModel::reduce_error() const { return lowp_->last_reduce_error(); }
int64_t FullyShardedModel::reduce_error_steps() const { return lowp_->measured_steps(); }

int64_t FullyShardedModel::gathered_bytes() const { return policy_->bytes_alive(); }
int64_t FullyShardedModel::gathered_bytes_peak() const { return policy_->peak; }
void FullyShardedModel::reset_gathered_peak() { policy_->peak = policy_->bytes_alive(); }

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

void FullyShardedModel::save_sharded(const std::filesystem::path& dir, int64_t step) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  HT_CHECK(!ec, "fsdp: cannot create the checkpoint folder {}: {}", dir.string(), ec.message());
  io::TensorList tensors;
  nlohmann::json shapes = nlohmann::json::object(), chunks = nlohmann::json::object();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    tensors.emplace_back("model/" + p.name, p.shard.detach());
    shapes["model/" + p.name] = p.shape.vec();
    chunks["model/" + p.name] = p.chunk;
    for (std::size_t k = 0; k < shards_->state_names().size(); ++k) {
      const Tensor& s = shards_->state(i, k);
      if (!s.defined()) continue;
      const std::string key = "optim/" + p.name + "." + shards_->state_names()[k];
      tensors.emplace_back(key, s);
      shapes[key] = p.shape.vec();
      chunks[key] = p.chunk;
    }
  }
  nlohmann::json meta = {{"world_size", comm_.size()}, {"rank", comm_.rank()}, {"shapes", shapes}, {"chunks", chunks}};
  if (step >= 0) meta["step"] = step;
  io::save_safetensors(dir / fmt::format("shard-{}-of-{}.safetensors", comm_.rank(), comm_.size()), tensors,
                       {{"hadatrain_fsdp", meta.dump()}});
}

}  // namespace ht::dist
