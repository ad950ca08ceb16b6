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

# Tokenizers (src/data/tokenizer_*.cpp), both optional: a build without one says so here and load_tokenizer
# names the file it could not read. SentencePiece models (Llama 1/2 tokenizer.model) through
# libsentencepiece (libsentencepiece-dev); tokenizer.json byte-level BPE (Llama 3) needs PCRE2's 8-bit
# library with Unicode support for its pre-tokenisation regex (libpcre2-dev).
find_path(SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h)
find_library(SENTENCEPIECE_LIBRARY sentencepiece)
if(SENTENCEPIECE_INCLUDE_DIR AND SENTENCEPIECE_LIBRARY)
  message(STATUS "SentencePiece: ${SENTENCEPIECE_LIBRARY}: tokenizer.model files are read")
else()
  message(STATUS "SentencePiece not found: tokenizer.model files give an error (install libsentencepiece-dev)")
endif()
find_path(PCRE2_INCLUDE_DIR pcre2.h)
find_library(PCRE2_LIBRARY pcre2-8)
if(PCRE2_INCLUDE_DIR AND PCRE2_LIBRARY)
  message(STATUS "PCRE2: ${PCRE2_LIBRARY}: tokenizer.json (byte-level BPE) files are read")
else()
  message(STATUS "PCRE2 not found: tokenizer.json files give an error (install libpcre2-dev)")
endif()
