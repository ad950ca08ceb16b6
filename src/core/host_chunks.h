// Host work split over threads: for_chunks(n, align, fn) calls fn(begin, end) over [0, n) in contiguous chunks
// that start at multiples of `align`, on up to 16 threads with at least `min_per_thread` elements each (one
// thread below that), and returns when all are done. For loops whose element i depends on i alone (counter-based random draws, dtype conversions), so the
// result does not depend on the split or on the machine's core count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace ht::host {

template <class F>
void for_chunks(int64_t n, int64_t align, F fn, int64_t min_per_thread = int64_t{1} << 18) {
  const int64_t cores = std::min<int64_t>(16, std::max(1u, std::thread::hardware_concurrency()));
  const int64_t threads = std::clamp<int64_t>(n / min_per_thread, 1, cores);
  if (threads == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t per = ((n + threads - 1) / threads + align - 1) / align * align;
  std::vector<std::thread> pool;
  for (int64_t b = 0; b < n; b += per) pool.emplace_back(fn, b, std::min(n, b + per));
  for (std::thread& t : pool) t.join();
}

}  // namespace ht::host
