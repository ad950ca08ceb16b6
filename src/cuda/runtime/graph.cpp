// Step graphs (cuda/graph.h): record with stream capture, check what the recording left behind, instantiate.
#include "hadatrain/cuda/graph.h"

#include <fmt/format.h>

#include <vector>

#include "hadatrain/core/capture.h"
#include "hadatrain/core/error.h"
#include "hadatrain/cuda/caching_allocator.h"

namespace ht::cuda {

StepGraph::StepGraph(int device) : stream_(device) {}

StepGraph::~StepGraph() { reset(); }

void StepGraph::reset() {
  if (exec_) (void)cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
  nodes_ = 0;
  node_kinds_.clear();
}

std::string StepGraph::record(const std::function<void()>& body) {
  reset();
  DeviceGuard dg(device());
  StreamGuard sg(stream(), device());
  HT_CUDA_CHECK(cudaStreamSynchronize(stream()));  // errors of earlier work surface here, not as a refusal
  const int64_t blocks_before = live_graph_blocks();
  std::string why;
  cudaGraph_t graph = nullptr;
  recording_started();
  {
    StepCaptureScope scope;
    HT_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    std::string thrown;
    try {
      body();
    } catch (const std::exception& e) {
      thrown = e.what();
    }
    // A noted reason came before any exception (which ends the body): report the first thing that went wrong.
    if (!scope.reason().empty()) why = fmt::format("the step cannot be replayed: {}", scope.reason());
    else if (!thrown.empty()) why = fmt::format("the step failed while being recorded: {}", thrown);
    const cudaError_t end = cudaStreamEndCapture(stream(), &graph);
    if (end != cudaSuccess) {
      (void)cudaGetLastError();
      if (why.empty()) why = fmt::format("CUDA refused the recording: {}", cudaGetErrorString(end));
    }
  }
  const std::size_t held = recording_finished();
  if (why.empty() && held > 0)
    why = fmt::format("{} tensor(s) allocated before the step were freed during it", held);
  const int64_t leaked = live_graph_blocks() - blocks_before;
  if (why.empty() && leaked > 0)
    why = fmt::format("{} tensor(s) created during the step outlive it (a graph must free what it allocates)",
                      leaked);
  if (why.empty()) {
    const cudaError_t inst = cudaGraphInstantiate(&exec_, graph, 0);
    if (inst != cudaSuccess) {
      (void)cudaGetLastError();
      exec_ = nullptr;
      why = fmt::format("cudaGraphInstantiate failed: {}", cudaGetErrorString(inst));
    } else if (cudaGraphGetNodes(graph, nullptr, &nodes_) != cudaSuccess) {
      (void)cudaGetLastError();
      nodes_ = 0;  // only a statistic
    } else {
      std::vector<cudaGraphNode_t> list(nodes_);
      std::size_t n = nodes_;
      std::size_t kernels = 0, memsets = 0, copies = 0, memory = 0, other = 0;
      if (n > 0 && cudaGraphGetNodes(graph, list.data(), &n) == cudaSuccess) {
        for (std::size_t i = 0; i < n; ++i) {
          cudaGraphNodeType t;
          if (cudaGraphNodeGetType(list[i], &t) != cudaSuccess) t = cudaGraphNodeTypeEmpty;
          if (t == cudaGraphNodeTypeKernel) ++kernels;
          else if (t == cudaGraphNodeTypeMemset) ++memsets;
          else if (t == cudaGraphNodeTypeMemcpy) ++copies;
          else if (t == cudaGraphNodeTypeMemAlloc || t == cudaGraphNodeTypeMemFree) ++memory;
          else ++other;
        }
        node_kinds_ = fmt::format("{} kernels, {} memsets, {} copies, {} memory, {} other", kernels, memsets, copies,
                                  memory, other);
      }
      (void)cudaGetLastError();
    }
  }
  if (graph) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();  // a refused recording leaves no sticky error behind
  return why;
}

void StepGraph::replay() {
  HT_CHECK(exec_ != nullptr, "StepGraph::replay: nothing recorded (record() a step first)");
  DeviceGuard dg(device());
  HT_CUDA_CHECK(cudaGraphLaunch(exec_, stream()));
}

}  // namespace ht::cuda
