// The backward profile (Note [Backward profile] in src/autograd/engine.cpp). A header of its own: engine.h
// declares ht::grad(), which cannot share a translation unit with the ht::grad namespace of the pipelines.
#pragma once
#include <string>

namespace ht {

// Whether the backward is profiled: HADATRAIN_PROFILE_BACKWARD=1 in the environment (read once; unset or 0: off,
// another value is an error naming it).
bool backward_profiling();

// The per-node-name backward time table collected while backward_profiling(); the header line alone otherwise.
std::string backward_profile_report();

// Drops what the profile collected so far (e.g. warm-up steps, whose first calls include one-off costs such
// as cuDNN's algorithm search).
void backward_profile_reset();

}  // namespace ht
