// The CUDA caching allocator: stream-ordered allocation (cudaMallocAsync) from each device's default
// memory pool, whose release threshold is raised to UINT64_MAX so freed memory stays cached in the pool
// and is reused by later allocations instead of going back to the driver.
//
// Note [Stream-ordered frees]
// A block is allocated on the stream that is current at allocation time and that stream is recorded in
// the DataPtr context; the free (cudaFreeAsync) is ordered on the same stream, so it happens after every
// kernel queued there before the tensor died. Code that uses a tensor on a second stream must make the
// allocation stream wait for that work (Event::record + Event::wait) before dropping the tensor.
//
// Out of memory: the allocator synchronises the device, trims the pool and retries once; if that fails it
// throws ht::Error "CUDA out of memory on cuda:N: tried to allocate X; allocated Y, reserved Z, free F of
// total T" (sizes human-readable).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "hadatrain/tensor/allocator.h"

namespace ht::cuda {

struct MemoryStats {
  std::size_t allocated_bytes = 0;       // bytes in live allocations (as requested)
  std::size_t peak_allocated_bytes = 0;  // maximum of allocated_bytes since start or reset_peak()
  std::size_t reserved_bytes = 0;        // bytes the pool holds from the driver (cudaMemPoolAttrReservedMemCurrent)
  std::size_t peak_reserved_bytes = 0;   // cudaMemPoolAttrReservedMemHigh since start or reset_peak()
  uint64_t num_allocs = 0;               // successful allocations since start
  uint64_t num_frees = 0;
  uint64_t num_ooms = 0;                 // allocations that threw out of memory
};

// The caching allocator (installed for DeviceType::CUDA by the CUDA hooks on first use).
Allocator& caching_allocator();

// Statistics of `device` (default: the current device).
MemoryStats memory_stats(int device = -1);
// Sets the peaks to the current values.
void reset_peak(int device = -1);
// Returns cached, unused memory of `device`'s pool to the driver (after synchronising the device).
void empty_cache(int device = -1);

// Step-graph support (cuda/graph.h, Note [Step graphs]). Blocks allocated while this thread records a step
// are the graph's memory (allocation nodes); live_graph_blocks() counts those still alive. Between
// recording_started() and recording_finished(), a block allocated earlier and dropped on a stream that is
// recording is not freed but held back; recording_finished() frees the held blocks (in their streams'
// order, after the recording ended) and returns how many there were.
void recording_started();
std::size_t recording_finished();
int64_t live_graph_blocks();

// Moves the free of `data` (a block of this allocator) to `stream`, which must already be ordered after every use
// of the block queued on its allocation stream (Note [Side branches] in tensor/side_branch.h: the joining stream
// takes over what the side stream produced). Does nothing for memory of other allocators.
void free_on_stream(const DataPtr& data, cudaStream_t stream);

// Owned streams (cuda::Stream) report their creation and destruction (after synchronising): a block still
// alive when its allocation stream is destroyed is later freed in the legacy default stream's order instead
// of on the dead handle.
void note_stream_created(cudaStream_t stream);
void note_stream_destroyed(cudaStream_t stream);

// Debugging aid for tests: while `byte` is in [0, 255], every new allocation is filled with it on its
// stream (0xFF is NaN in every floating dtype), so reading memory an op never wrote shows up. -1 = off.
void set_poison_byte(int byte);

// "1.50 GiB", "12.00 MiB", "512 bytes".
std::string format_bytes(std::size_t bytes);

}  // namespace ht::cuda
