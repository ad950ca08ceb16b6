# Third-party libraries, all from the distribution's packages (tools/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(ZLIB REQUIRED)
# Image folders: JPEG through libjpeg(-turbo) (libjpeg-dev); PNG through libpng when present (libpng-dev),
# otherwise a PNG file gives an error that says so.
find_package(JPEG REQUIRED)
find_package(PNG QUIET)
if(PNG_FOUND)
  message(STATUS "libpng ${PNG_VERSION_STRING}: PNG files in image folders are decoded")
else()
  message(STATUS "libpng not found: PNG files in image folders give an error (install libpng-dev)")
endif()

# OpenBLAS: cblas.h lives in different places on Debian and Ubuntu.
find_path(OPENBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread
  PATHS /usr/include /usr/include/x86_64-linux-gnu)
find_library(OPENBLAS_LIBRARY NAMES openblas
  PATHS /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/openblas-pthread)
if(NOT OPENBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS not found: run tools/setup.sh (installs libopenblas-dev)")
endif()
add_library(hadatrain_openblas INTERFACE)
target_include_directories(hadatrain_openblas SYSTEM INTERFACE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(hadatrain_openblas INTERFACE ${OPENBLAS_LIBRARY})
message(STATUS "OpenBLAS: ${OPENBLAS_LIBRARY} (${OPENBLAS_INCLUDE_DIR})")

# yaml-cpp's exported target name changed between 0.7 and 0.8.
if(TARGET yaml-cpp::yaml-cpp)
  set(HADATRAIN_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(HADATRAIN_YAML_TARGET yaml-cpp)
endif()

# nlohmann/json (header only): the Debian/Ubuntu package, or headers carried in .deps/include on machines
# without it. Exposed as one INTERFACE target, hadatrain_json.
add_library(hadatrain_json INTERFACE)
find_package(nlohmann_json 3 QUIET)
if(nlohmann_json_FOUND)
  target_link_libraries(hadatrain_json INTERFACE nlohmann_json::nlohmann_json)
  message(STATUS "nlohmann_json: package ${nlohmann_json_VERSION}")
else()
  find_path(NLOHMANN_JSON_INCLUDE nlohmann/json.hpp HINTS ${PROJECT_SOURCE_DIR}/.deps/include)
  if(NOT NLOHMANN_JSON_INCLUDE)
    message(FATAL_ERROR "nlohmann/json.hpp not found: run tools/setup.sh (installs nlohmann-json3-dev) "
                        "or put the headers in ${PROJECT_SOURCE_DIR}/.deps/include")
  endif()
  target_include_directories(hadatrain_json SYSTEM INTERFACE ${NLOHMANN_JSON_INCLUDE})
  message(STATUS "nlohmann_json: headers in ${NLOHMANN_JSON_INCLUDE}")
endif()
