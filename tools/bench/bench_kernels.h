// Declarations shared by the pieces of the bench_kernels program (bench_kernels*.cpp): the timing helper and
// the benchmark blocks main() in bench_kernels.cpp runs, each defined in the file named beside it.
#pragma once
#include <functional>

namespace ht::bench {

// The median time in ms of one run of fn: CUDA events on the legacy stream around `iters` back-to-back runs,
// after a warm-up run (allocator caching) and a device synchronisation, median of `reps` such batches.
double time_ms(const std::function<void()>& fn, int iters = 10, int reps = 7);

// The blocks (bench_kernels --only BLOCK). csv: comma-separated rows instead of the table; copy_gbs: the copy
// bandwidth of the main table (GB/s), the floor the "vs copy" columns divide by.
void bench_lowp_gemm(bool csv);                          // bench_kernels_quant.cpp
void bench_grad_quant(bool csv, double copy_gbs);        // bench_kernels_quant.cpp
void bench_hla(bool csv, double copy_gbs);               // bench_kernels_quant.cpp
void bench_attention(bool csv);                          // bench_kernels_attention.cpp
void bench_attention_packed(bool csv);                   // bench_kernels_attention.cpp
void bench_norm_gelu(bool csv, double copy_gbs);         // bench_kernels_rows.cpp
void bench_bn_relu(bool csv);                            // bench_kernels_rows.cpp
void bench_bn_gelu_variants(bool csv, double copy_gbs);  // bench_kernels_rows.cpp
void bench_norm_variants(bool csv, double copy_gbs);     // bench_kernels_rows.cpp
void bench_fold(bool csv, double copy_gbs);              // bench_kernels_layout.cpp
void bench_pool(bool csv);                               // bench_kernels_layout.cpp

}  // namespace ht::bench
