// The backward engine. Iterative: a dependency count per node, a ready stack, per-node input buffers.
#include "hadatrain/autograd/engine.h"
#include "hadatrain/autograd/profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "hadatrain/autograd/function.h"
#include "hadatrain/autograd/meta.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/tensor/cuda_hooks.h"
#include "hadatrain/tensor/factory.h"

namespace ht {
namespace {

// Note [Backward profile]
// With HADATRAIN_PROFILE_BACKWARD=1 in the environment, every node's apply() is timed between two device
// synchronisations (CUDA device 0 when present) and summed by node name; backward_profile_report() returns
// the table. Synchronising serialises the GPU, so the totals are for finding where time goes, not for
// step times. Off (one getenv at start-up) it costs nothing.
struct Profile {
  std::mutex mu;
  std::map<std::string, std::pair<double, int64_t>> by_name;  // seconds, calls
};
Profile& profile() {
  static Profile p;
  return p;
}
void device_sync() {
  if (const CudaHooks* h = cuda_hooks(); h != nullptr && h->device_count() > 0) h->synchronize(Device::cuda(0));
}

std::atomic<int64_t> g_in_place{0};

struct Capture {
  Node* fn;
  uint32_t input_nr;
};

// Runs the graph below `root_edges`. With `captures`, gradients arriving at those (node, slot) pairs are
// returned instead of being accumulated, and no AccumulateGrad runs.
std::vector<Tensor> execute(const std::vector<Edge>& root_edges, std::vector<Tensor> root_grads,
                            BackwardOptions opts, const std::vector<Capture>* captures) {
  GradModeGuard no_grad(false);
  // 1. Dependency counts by an explicit-stack DFS.
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const auto& e : root_edges)
    if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges()) {
      if (!e.valid()) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
  // 2. Seed the input buffers of the roots.
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  auto add_to_buffer = [&](Node* n, uint32_t slot, Tensor g) {
    auto& buf = buffers[n];
    if (buf.size() < n->num_outputs()) buf.resize(n->num_outputs());
    HT_ASSERT(slot < buf.size(), "{}: gradient for output {} but the node has {} outputs", n->name(), slot,
              buf.size());
    buf[slot] = buf[slot].defined() ? add(buf[slot], g) : std::move(g);
  };
  for (std::size_t i = 0; i < root_edges.size(); ++i)
    add_to_buffer(root_edges[i].fn.get(), root_edges[i].input_nr, std::move(root_grads[i]));

  std::vector<Tensor> captured(captures ? captures->size() : 0);
  std::vector<std::shared_ptr<Node>> keep_alive;  // roots may be owned only by their tensors
  std::vector<Node*> ready;
  for (const auto& e : root_edges) {
    keep_alive.push_back(e.fn);
    if (deps[e.fn.get()] == 0 && std::find(ready.begin(), ready.end(), e.fn.get()) == ready.end())
      ready.push_back(e.fn.get());
  }
  // 3. Run nodes whose gradients are complete.
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    std::vector<Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(n->num_outputs());
    std::vector<Tensor> outs;
    bool run = true;
    if (captures) {
      for (std::size_t c = 0; c < captures->size(); ++c)
        if ((*captures)[c].fn == n) captured[c] = grads[(*captures)[c].input_nr];
      run = dynamic_cast<AccumulateGrad*>(n) == nullptr;
    }
    if (run) {
      std::chrono::steady_clock::time_point t0;
      if (backward_profiling()) {
        device_sync();
        t0 = std::chrono::steady_clock::now();
      }
      // Note [Gradients accumulated in place]: offer the buffers gathered so far that nothing else holds.
      std::vector<Tensor> into;
      if (n->accepts_grad_buffers()) {
        const auto& edges = n->next_edges();
        into.resize(edges.size());
        for (std::size_t i = 0; i < edges.size(); ++i) {
          if (!edges[i].valid()) continue;
          auto it = buffers.find(edges[i].fn.get());
          if (it == buffers.end() || edges[i].input_nr >= it->second.size()) continue;
          Tensor& pending = it->second[edges[i].input_nr];
          if (pending.defined() && pending.impl_ptr().use_count() == 1 && pending.storage().use_count() == 1)
            into[i] = std::move(pending);
        }
      }
      outs = into.empty() ? n->apply(std::move(grads)) : n->apply_into(std::move(grads), into);
      for (std::size_t i = 0; i < into.size(); ++i) {
        if (!into[i].defined()) continue;
        const Edge& e = n->next_edges()[i];
        Tensor& slot = buffers[e.fn.get()][e.input_nr];
        if (i < outs.size() && outs[i].defined() && outs[i].impl_ptr() == into[i].impl_ptr()) {
          slot = std::move(outs[i]);  // the node added its gradient into the buffer: nothing left to sum
          outs[i] = Tensor();
          g_in_place.fetch_add(1, std::memory_order_relaxed);
        } else {
          slot = std::move(into[i]);  // declined: the buffer goes back, the node's gradient is added below
        }
      }
      if (backward_profiling()) {
        device_sync();
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(profile().mu);
        auto& e = profile().by_name[n->name()];
        e.first += sec;
        ++e.second;
      }
      HT_ASSERT(outs.empty() || outs.size() == n->next_edges().size(),
                "{} returned {} gradients for {} inputs", n->name(), outs.size(), n->next_edges().size());
      if (!opts.retain_graph) n->release_saved();
    }
    const auto& edges = n->next_edges();
    for (std::size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].valid()) continue;
      Node* next = edges[i].fn.get();
      if (i < outs.size() && outs[i].defined()) add_to_buffer(next, edges[i].input_nr, std::move(outs[i]));
      if (--deps[next] == 0) ready.push_back(next);
    }
  }
  return captured;
}

std::vector<Tensor> default_root_grads(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  std::vector<Tensor> out(roots.size());
  for (std::size_t i = 0; i < roots.size(); ++i) {
    const Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (g.defined()) {
      HT_CHECK(g.shape() == roots[i].shape(), "backward: gradient {} does not match output {}", g.describe(),
               roots[i].describe());
      out[i] = g;
    } else {
      HT_CHECK(roots[i].numel() == 1,
               "backward: a gradient must be given for output {} (only one-element outputs default to 1)",
               roots[i].describe());
      out[i] = ones_like(roots[i]);
    }
  }
  return out;
}

std::vector<Edge> root_edges_of(const std::vector<Tensor>& roots) {
  std::vector<Edge> edges;
  for (const auto& r : roots) {
    Edge e = gradient_edge(r);
    HT_CHECK(e.valid(), "backward: output {} does not require grad and has no grad_fn", r.describe());
    edges.push_back(e);
  }
  return edges;
}

}  // namespace

int64_t grads_accumulated_in_place() { return g_in_place.load(std::memory_order_relaxed); }

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, BackwardOptions opts) {
  execute(root_edges_of(roots), default_root_grads(roots, grads), opts, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, BackwardOptions opts) {
  std::vector<Capture> caps;
  std::vector<Edge> keep;  // holds accumulators created here alive during the walk
  for (const auto& in : inputs) {
    Edge e = gradient_edge(in);
    HT_CHECK(e.valid(), "grad: input {} does not require grad", in.describe());
    caps.push_back({e.fn.get(), e.input_nr});
    keep.push_back(e);
  }
  return execute(root_edges_of(outputs), default_root_grads(outputs, grad_outputs), opts, &caps);
}

bool backward_profiling() {
  static const bool on = [] {
    const char* v = std::getenv("HADATRAIN_PROFILE_BACKWARD");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "0") == 0) return false;
    HT_CHECK(std::strcmp(v, "1") == 0, "HADATRAIN_PROFILE_BACKWARD={} is not 0 or 1", v);
    return true;
  }();
  return on;
}

std::string backward_profile_report() {
  std::lock_guard<std::mutex> lock(profile().mu);
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(profile().by_name.begin(),
                                                                       profile().by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  for (const auto& r : rows) total += r.second.first;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-44s %10s %8s %7s\n", "backward node", "total ms", "calls", "share");
  out += line;
  for (const auto& [name, v] : rows) {
    std::snprintf(line, sizeof line, "%-44s %10.2f %8lld %6.1f%%\n", name.c_str(), v.first * 1e3,
                  static_cast<long long>(v.second), total > 0 ? 100.0 * v.first / total : 0.0);
    out += line;
  }
  return out;
}

void backward_profile_reset() {
  std::lock_guard<std::mutex> lock(profile().mu);
  profile().by_name.clear();
}

}  // namespace ht
