// Shared by the tokenizer tests: where tools/fetch_lm_data.sh puts the Llama tokenizers, the two tokenizers
// loaded once per test program, and the reference ids of tests/fixtures/tokenizer_ids.json.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/catch.h"

#include "hadatrain/core/error.h"
#include "hadatrain/data/tokenizer.h"

namespace tk_test {

// ${HADATRAIN_CACHE:-$HOME/.cache/hadatrain}/lm, as tools/fetch_lm_data.sh writes it.
inline std::filesystem::path lm_cache() {
  if (const char* c = std::getenv("HADATRAIN_CACHE"); c && *c) return std::filesystem::path(c) / "lm";
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : ".") / ".cache" / "hadatrain" / "lm";
}

// Fails the test (never skips) when the cache is missing: the README's test command fetches it first.
inline std::filesystem::path cached(const std::string& rel) {
  const std::filesystem::path p = lm_cache() / rel;
  if (!std::filesystem::exists(p))
    FAIL(p.string() << " is missing: run tools/fetch_lm_data.sh (fetches the Llama tokenizers and the CC0 "
                       "texts into ${HADATRAIN_CACHE:-$HOME/.cache/hadatrain}/lm)");
  return p;
}

// True when this build has both engines. Otherwise (libsentencepiece or PCRE2 left out at build time) it
// checks that loading the missing engine's file says so, warns, and the caller's test case ends there.
inline bool engines_built() {
  bool all = true;
  for (auto [kind, file] : {std::pair{"bpe", "llama3/tokenizer.json"}, {"sentencepiece", "llama2/tokenizer.model"}}) {
    if (ht::data::tokenizer_engine_built(kind)) continue;
    all = false;
    WARN("this build has no " << kind << " tokenizer engine: only its error message is tested");
    CHECK_THROWS_WITH(ht::data::load_tokenizer(cached(file)), HasSubstr("hadatrain was built without"));
  }
  return all;
}

inline const ht::data::Tokenizer& llama3() {
  static std::unique_ptr<ht::data::Tokenizer> tok = ht::data::load_tokenizer(cached("llama3"));
  return *tok;
}
inline const ht::data::Tokenizer& llama2() {
  static std::unique_ptr<ht::data::Tokenizer> tok = ht::data::load_tokenizer(cached("llama2/tokenizer.model"));
  return *tok;
}

// tests/fixtures/tokenizer_ids.json (tests run in the repository root).
inline const nlohmann::json& reference() {
  static const nlohmann::json j = [] {
    std::ifstream in("tests/fixtures/tokenizer_ids.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

}  // namespace tk_test
