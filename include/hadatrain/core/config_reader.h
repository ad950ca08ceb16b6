// Strict YAML config reading: a ConfigReader walks one section (a YAML map) of a config file and fills
// typed values with defaults. Every problem is an ht::Error whose message names where the value came
// from (file:line:column, or the `--set key=value` that introduced it), the full dotted key, what was
// expected and what was found:
//
//   configs/x.yaml:7:5: optim.lr: expected a number > 0, got -1
//
// It lives in core/ because layers on both sides of the stack read configs through it: train/ reads the run's
// sections, and each gradient pipeline in grad/ reads its own options (grad/registry.h).
//
// Usage (see train/trainer_config.cpp):
//   ConfigReader root = ConfigReader::load_file(path, overrides);   // overrides: {"optim.lr=0.1", ...}
//   ConfigReader optim = root.child("optim");
//   double lr = optim.get("lr", 0.1, Range::positive());
//   root.finish();                 // rejects keys that no get()/child() asked for, in every section
//   std::string yaml = root.resolved_yaml();  // every value asked for, after defaults and overrides
//
// Note [Config override sources]
// `--set a.b=c` overrides are applied to the YAML tree before typed parsing: the value is parsed as a YAML
// scalar or flow value (`--set model.hidden=[512,256]`) and written at the dotted path, creating sections as
// needed. The document remembers each override, so an error about a value that came from an override (or
// a key it introduced, found unknown by finish()) names `--set a.b=c` as its source instead of a file line.
// `--set a.b=null` (or ~) removes a key the file (or an earlier --set) gives, whatever its name: the section then
// reads as if it never held it. A key nothing gave is left holding null, which reads as absent, and finish()
// still checks its name, so a misspelt one is reported.
//
// Note [A --set that switches a choice]
// The keys a section accepts can depend on a value: optim.momentum exists for optim.name sgd only,
// schedule.milestones for schedule.name multistep, model.hidden for model.name mlp, the image keys of data for
// the image datasets, a grad_pipeline entry's options for its pipeline, data.rand_augment.increasing for policy
// timm, model.preset without model.init_from, dist.fsdp_units for dist.mode fsdp, optim.layer_decay (a key of another
// section) for model.name vit. A --set that changes such a value (`--set optim.name=adamw` on a file that sets SGD's
// momentum) would leave the file's keys for the old choice behind, and the strict reading would refuse them. So the
// config's reader also runs over the config as the file alone gives it (as_in_file() of the root, handed to
// drop_keys_only_read_by()): a key that the file gives and that reading accepts but this one does not belongs to
// the choice the --set replaced. finish() drops it and leaves a note (notes()) naming the --set, the key and its
// file line, and the file's keys that both readings accept and so keep their values (optim.lr: an SGD learning
// rate is rarely right for AdamW). A key that a --set gives, or that the file's own reading refuses too (a misspelt
// key), is still an error.
// What a reading does not accept is what it did not ask for, or what it rejected: reject() for a key that does not
// apply to this choice with a reason for the error, and reject_unless() for a key that a config.yaml saved by a run
// records at a value where the key does nothing (model.num_classes 0 for a llama, dist.fsdp_units [] under ddp:
// the runs recorded every key they read). That value passes silently in a file, so saved configs run again; any other
// value is an error with the reason; and a --set that switches the choice drops the file's key whatever its value,
// since it belongs to the old choice. A key whose choice is decided in another section (optim.layer_decay by
// model.name) names that key (`decided_by`), so that the note names the --set of it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "hadatrain/core/error.h"
#include "hadatrain/core/spellings.h"

namespace ht {

// An allowed numeric interval for a config value, with the words used in error messages.
class Range {
 public:
  static Range any() { return {}; }
  static Range positive() { return lower(0.0, false); }                         // > 0
  static Range non_negative() { return lower(0.0, true); }                      // >= 0
  static Range at_least(double lo) { return lower(lo, true); }                  // >= lo
  static Range closed(double lo, double hi) { return both(lo, hi, true); }      // [lo, hi]
  static Range half_open(double lo, double hi) { return both(lo, hi, false); }  // [lo, hi)
  static Range open(double lo, double hi) {                                     // (lo, hi)
    Range r = both(lo, hi, false);
    r.lo_closed_ = false;
    return r;
  }
  static Range open_closed(double lo, double hi) {                              // (lo, hi]
    Range r = both(lo, hi, true);
    r.lo_closed_ = false;
    return r;
  }

  bool contains(double v) const;
  // " > 0", " >= 1", " in [0, 1)", or "" for any().
  std::string describe() const;

 private:
  static Range lower(double lo, bool closed) {
    Range r;
    r.has_lo_ = true;
    r.lo_ = lo;
    r.lo_closed_ = closed;
    return r;
  }
  static Range both(double lo, double hi, bool hi_closed) {
    Range r = lower(lo, true);
    r.has_hi_ = true;
    r.hi_ = hi;
    r.hi_closed_ = hi_closed;
    return r;
  }
  bool has_lo_ = false, lo_closed_ = false, has_hi_ = false, hi_closed_ = false;
  double lo_ = 0, hi_ = 0;
};

class ConfigReader {
 public:
  // Reads and parses a YAML file, then applies `overrides` ("a.b=value" each). Throws on a missing file,
  // malformed YAML (file:line:column) or a malformed override.
  static ConfigReader load_file(const std::string& path, const std::vector<std::string>& overrides = {});
  // The same for YAML text; `source_name` stands in for the file name in messages.
  static ConfigReader from_string(const std::string& yaml, const std::string& source_name,
                                  const std::vector<std::string>& overrides = {});

  // Typed value of `key` in this section, or `def` when the key is absent. Numbers are checked against
  // `range`. Supported T: bool, int, int64_t, uint64_t, double, std::string. Explicit nulls, quoted numbers,
  // lists and maps where a scalar is expected are errors.
  template <class T>
  T get(const std::string& key, const T& def, const Range& range = Range::any());
  std::string get(const std::string& key, const char* def) { return get<std::string>(key, std::string(def)); }
  // Like get() but the key must be present.
  template <class T>
  T require(const std::string& key, const Range& range = Range::any());
  // A list (block or flow sequence) of T, every element checked against `range`.
  template <class T>
  std::vector<T> get_list(const std::string& key, const std::vector<T>& def, const Range& range = Range::any());
  // A string that must be one of `allowed`, or an alias of one of them in `spellings` (core/spellings.h), which
  // reads as, and is recorded as, the name it stands for: get_enum("precision", "fp32", {"fp32", "bf16"},
  // float_spellings()) returns fp32 for f32. An error lists every accepted name.
  std::string get_enum(const std::string& key, const std::string& def, const std::vector<std::string>& allowed,
                       const Spellings& spellings = {});
  // get_enum mapped onto an enum class: choices = {{"relu", Act::relu}, {"gelu", Act::gelu}}.
  template <class E>
  E get_choice(const std::string& key, E def, const std::vector<std::pair<std::string, E>>& choices,
               const Spellings& spellings = {});

  // The sub-section `key` (a map). Absent or null sections read as empty, so all their values default.
  ConfigReader child(const std::string& key);
  // True when `key` is present in this section (also marks it as known to the schema).
  bool has(const std::string& key);
  // True when `key` is present and holds a section (a map), for keys that take either a string or a section.
  bool holds_section(const std::string& key) const;
  // The keys present in this section, in document order (for sections whose keys are user data, such as
  // module-name patterns). Does not mark them known: read each with child()/get().
  std::vector<std::string> keys() const;

  // `key` does not apply in this reading, for `reason` ("applies to policy timm only"): when the section holds it,
  // finish() reports "<where>: <key>: <reason>" instead of "unknown key" (or drops it: Note [A --set that switches
  // a choice]). The reading goes on without the key (its default). `decided_by` is the dotted key of another
  // section whose value decided this ("model.name"), "" for a value of this section. Does not mark the key as known.
  void reject(const std::string& key, const std::string& reason, const std::string& decided_by = "");
  // reject(), except that the key may hold `inert`, the value at which it does nothing, which passes silently and
  // is not recorded: a config.yaml saved by a run holds every key the run read, this one at that value.
  // T: bool, int, int64_t, double, std::string or std::vector<std::string>.
  template <class T>
  void reject_unless(const std::string& key, const T& inert, const std::string& reason,
                     const std::string& decided_by = "");
  void reject_unless(const std::string& key, const char* inert, const std::string& reason,
                     const std::string& decided_by = "") {
    reject_unless<std::string>(key, std::string(inert), reason, decided_by);
  }
  // reject_unless for a string option whose values have other spellings: `inert` passes in any of them, as the
  // reading of the option would take it (Note [Float spellings] in core/spellings.h).
  void reject_unless(const std::string& key, const std::string& inert, const Spellings& spellings,
                     const std::string& reason, const std::string& decided_by = "");

  // Throws the error for every key in this section and the sections reached through child() that no
  // get()/child()/has() asked for, or that the reading rejected: "<where>: optim.lrr: unknown key (optim accepts:
  // lr, ...; did you mean 'lr'?)". Keys of a choice a --set replaced are dropped instead, with a note
  // (drop_keys_only_read_by).
  void finish();

  // Note [A --set that switches a choice].
  // Whether a --set wrote a key in this section or below it.
  bool overridden() const;
  // This section as the config file alone gives it, before any --set: a reader of its own over a copy of the
  // file's tree (nothing asked of it is recorded in this one; its errors are not meant to be shown).
  ConfigReader as_in_file() const;
  // `file_reading` is as_in_file() of this section, read by the same schema. finish() drops the keys of this
  // section and of the sections below it that the file gives and `file_reading` accepts but this reading does not,
  // and records a note for each section it dropped keys from.
  void drop_keys_only_read_by(const ConfigReader& file_reading);
  // What finish() dropped, one line per section, for the caller to log.
  const std::vector<std::string>& notes() const;

  // Throws an ht::Error located at `key` of this section (its value if present, else the section).
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  // Where the value of `key` came from, for a message about another key that names this one too: file:line:column,
  // or the --set that gave it; "" when the key is not given (its default applies).
  std::string location(const std::string& key) const;

  // The full dotted path of this section ("" for the root) and of `key` within it.
  const std::string& path() const;
  std::string key_path(const std::string& key) const;
  // The file (or source name) this config came from.
  const std::string& source() const;

  // Every value asked for so far (given or defaulted), as a YAML tree in the order asked.
  YAML::Node resolved() const;
  std::string resolved_yaml() const;

  struct Section;  // implementation detail (src/core/config_internal.h)

 private:
  explicit ConfigReader(std::shared_ptr<Section> s) : s_(std::move(s)) {}
  std::shared_ptr<Section> s_;
};

template <class E>
E ConfigReader::get_choice(const std::string& key, E def, const std::vector<std::pair<std::string, E>>& choices,
                           const Spellings& spellings) {
  std::vector<std::string> names;
  std::string def_name;
  for (const auto& [name, value] : choices) {
    names.push_back(name);
    if (value == def) def_name = name;
  }
  HT_ASSERT(!def_name.empty(), "default of config key {} is not among its choices", key_path(key));
  const std::string picked = get_enum(key, def_name, names, spellings);
  for (const auto& [name, value] : choices)
    if (name == picked) return value;
  HT_ASSERT(false, "unreachable: {} not among choices", picked);
  return def;
}

}  // namespace ht
