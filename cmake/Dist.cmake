# The communicator engines of src/dist (include/hadatrain/dist/communicator.h), each optional:
#   Gloo (CPU tensors; Debian libgloo-dev): HADATRAIN_GLOO, src/dist/gloo_*.cpp built when found.
#   NCCL (CUDA tensors; found by cmake/Cuda.cmake in CUDA builds): HADATRAIN_NCCL, src/dist/nccl_*.cpp.
# A build without either still builds; `hadatrain version` lists the engines it has.
option(HADATRAIN_WITH_GLOO "Build the Gloo communicator engine when libgloo is found" ON)
option(HADATRAIN_WITH_NCCL "Build the NCCL communicator engine when CUDA and NCCL are found" ON)
set(HADATRAIN_GLOO OFF)
if(HADATRAIN_WITH_GLOO)
  find_package(Gloo CONFIG QUIET)
  if(TARGET gloo)
    set(HADATRAIN_GLOO ON)
    message(STATUS "Gloo ${GLOO_VERSION}: the gloo communicator engine (CPU tensors) is built")
  else()
    message(STATUS "Gloo not found: no gloo communicator engine (CPU multi-process training); install libgloo-dev")
  endif()
else()
  message(STATUS "HADATRAIN_WITH_GLOO=OFF: no gloo communicator engine")
endif()
set(HADATRAIN_NCCL OFF)
if(HADATRAIN_WITH_NCCL AND HADATRAIN_CUDA AND NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
  set(HADATRAIN_NCCL ON)
  message(STATUS "NCCL: the nccl communicator engine (CUDA tensors) is built")
elseif(NOT HADATRAIN_WITH_NCCL)
  message(STATUS "HADATRAIN_WITH_NCCL=OFF: no nccl communicator engine")
else()
  message(STATUS "no nccl communicator engine (needs a CUDA build and NCCL)")
endif()

# hadatrain_dist_filter_sources(VAR): drops the sources of the engines not found from the list VAR.
function(hadatrain_dist_filter_sources var)
  set(sources ${${var}})
  if(NOT HADATRAIN_GLOO)
    list(FILTER sources EXCLUDE REGEX "/src/dist/gloo_[^/]*\\.cpp$")
  endif()
  if(NOT HADATRAIN_NCCL)
    list(FILTER sources EXCLUDE REGEX "/src/dist/nccl_[^/]*\\.cpp$")
  endif()
  set(${var} ${sources} PARENT_SCOPE)
endfunction()

# hadatrain_dist_configure(TARGET): links what the engines found need. The engine switches are defined on
# src/dist/communicator.cpp alone (the one file that asks), so finding or losing an engine recompiles that
# file and nothing else.
function(hadatrain_dist_configure target)
  set(defs)
  if(HADATRAIN_GLOO)
    target_link_libraries(${target} PRIVATE gloo)
    list(APPEND defs HADATRAIN_HAVE_GLOO=1)
  endif()
  if(HADATRAIN_NCCL)
    list(APPEND defs HADATRAIN_HAVE_NCCL=1)
  endif()
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/dist/communicator.cpp PROPERTIES COMPILE_DEFINITIONS "${defs}")
endfunction()
