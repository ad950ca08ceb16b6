// The backward profile (Note [Backward profile] in src/autograd/engine.cpp). A header of its own: engine.h
// declares ht::grad(), which cannot share a translation unit with the ht::grad namespace of the pipelines.
#pragma once
#include <string>

namespace ht {

// The per-node-name backward time table collected when HADATRAIN_PROFILE_BACKWARD is set; the header line
// alone otherwise.
std::string backward_profile_report();

// Drops what the profile collected so far (e.g. warm-up steps, whose first calls include one-off costs such
// as cuDNN's algorithm search).
void backward_profile_reset();

}  // namespace ht
