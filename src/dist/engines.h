// The engines' constructors, internal to src/dist: each is compiled only when its library was found
// (HADATRAIN_HAVE_GLOO, HADATRAIN_HAVE_NCCL; cmake/Dist.cmake), and make_communicator calls only those.
#pragma once
#include <memory>

#include "hadatrain/dist/communicator.h"

namespace ht::dist {

std::unique_ptr<Communicator> make_gloo_communicator(Store& store, const CommunicatorOptions& options);
std::unique_ptr<Communicator> make_nccl_communicator(Store& store, const CommunicatorOptions& options);

}  // namespace ht::dist
