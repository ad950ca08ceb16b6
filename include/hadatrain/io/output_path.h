// Checks of where a command will write, made before the work that produces the output, so that a path that cannot
// be written fails at once with the flag or config key that named it instead of after minutes of computation (or
// as a bare std::filesystem error). Nothing is created.
//
//   io::check_output_path(a.output, io::OutputKind::directory, "--output");
//   ... the conversion ...
//   io::create_output_directory(a.output, "--output");
#pragma once
#include <filesystem>
#include <string_view>

namespace ht::io {

enum class OutputKind {
  file,       // written atomically (atomic_file.h): a temporary file beside it, renamed over it
  directory,  // created with its missing parents when it does not exist
};

// Throws ht::Error "<what>: ..." naming `path` when it cannot become an output of `kind`:
//   - an existing path of the other kind (a regular file where a folder is needed, a folder where a file is),
//   - a dangling symbolic link,
//   - a missing path whose nearest existing ancestor is not a directory (so it cannot be created) or not
//     writable, and an existing directory (kind directory), or the folder of an existing file, that is not writable.
// Relative paths are taken from the working directory.
void check_output_path(const std::filesystem::path& path, OutputKind kind, std::string_view what);

// Creates the directory `path` and its missing parents; errors are ht::Error "<what>: cannot create ..." naming
// the path and the reason.
void create_output_directory(const std::filesystem::path& path, std::string_view what);

}  // namespace ht::io
