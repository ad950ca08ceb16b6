// An 8-bit weight handed to the `halo` pipeline with the tensor a layer computes with (docs/distributed.md,
// "HALO layers"): HQ-FSDP's all-gather (dist.gather_dtype int8 / fp8, reference/halo.md §6) moves the weight as
// rows rotated by HALO's H̃ and quantised with one scale per weight, which is HALO's own Q(W·H̃) when the layer's
// level rotates W (1 or 2) and its carrier is the gather's. The FSDP policy attaches the gathered codes and scale
// to the tensor it materialises; the halo pipeline's forward looks them up and multiplies them instead of
// quantising W again (its phase hook then marks "fwd Q(W·H) from the 8-bit gather" instead of "fwd Q(W·H)").
//
// Note [Gathered 8-bit weights]
// The attachment is keyed by the tensor's storage and element offset (the layer's detach, reshape or view of
// the materialised tensor shares both), holds no strong reference to either side, and is found only while
// the storage and the GatheredWeight are both alive: the FSDP policy owns the GatheredWeight and drops it when it
// frees the gathered tensor (reshard after forward) or ends the step, so a stale attachment is never used. A
// tensor whose storage was refilled in place (the re-gather in backward) is attached again by the policy with
// the re-gather's codes, which are byte-identical (the step's shared absmax is reused).
#pragma once
#include <cstdint>
#include <memory>

#include "hadatrain/grad/pipeline_halo.h"

namespace ht::grad {

struct GatheredWeight {
  Tensor codes;           // (O, n) i8 or f8e4m3 contiguous: row o = Q(W[o]·H̃), zero-padded from C to n columns
  Tensor scale;           // f32 (1) on the codes' device: the weight's scale (absmax / qmax)
  Carrier carrier = Carrier::int8;
  HaloRotation rotation;  // halo_rotation_size(C)
  int64_t cols = 0;       // C: the weight's columns (its `in`, or in·kh·kw of a conv)
};

// Attaches `g` to `w` (Note [Gathered 8-bit weights]); w must have a storage. Thread-safe.
void attach_gathered_weight(const Tensor& w, const std::shared_ptr<const GatheredWeight>& g);
// The weight attached to w's storage at w's offset, when both are alive and its codes have w.size(0) rows
// and w.numel() / w.size(0) columns; else null.
std::shared_ptr<const GatheredWeight> gathered_weight(const Tensor& w);

// How many times a halo pipeline's forward used a gathered weight instead of quantising W itself, since the
// process started (tests).
int64_t gathered_weight_uses();
void note_gathered_weight_use();

}  // namespace ht::grad
