// Other spellings of an option's values: a config file or a command-line option may give an alias wherever the
// canonical name is accepted, and the reading hands on the canonical name. The config reader (config_reader.h:
// get_enum, get_choice, reject_unless) and the hadatrain program's option checks take them.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace ht {

// {alias, canonical} pairs.
using Spellings = std::vector<std::pair<std::string, std::string>>;

// Note [Float spellings]
// Two spellings of the float formats are in use: fp32 (train.precision, dist.gather_dtype beside fp8 and int8,
// `generate --precision`) and f32 (the tensor dtypes' names, which train.dtype, dist.reduce_dtype and `convert --dtype`
// followed). Every option that names a float format accepts both, fp32 or f32 and fp64 or f64, so `reduce_dtype: fp32`
// beside `gather_dtype: fp32` reads as written. fpN is the canonical one: the reading returns it and the resolved
// config.yaml records it, so a saved config holds one spelling and runs again as saved, and a config saved with the
// other spelling (`dtype: f32`, `reduce_dtype: f32`) reads to the same values. The value at which a key of another
// choice passes (ConfigReader::reject_unless) passes in either spelling. torch's names (float32, bfloat16) are not
// taken: they would be a third spelling of every format, bf16's included; an error lists the accepted ones.
const Spellings& float_spellings();

// The canonical name of `value`, or `value` itself when it is no alias.
const std::string& canonical_spelling(const std::string& value, const Spellings& spellings);

// `name` with its aliases, for messages: "fp32 (or f32)"; "bf16" when it has none.
std::string with_aliases(const std::string& name, const Spellings& spellings);

}  // namespace ht
