// See file_walk.h.
//
// Note [Symbolic links in folder walks]
// Links are followed, to files and to folders, as os.walk(followlinks=True) follows them (torchvision's
// ImageFolder): datasets are often made of links into one shared copy, and a folder reached by two links is
// listed twice, there as here. A link that leads back into a folder the walk is already in would make the walk
// endless: os.walk goes on until the path grows too long, listing the same files dozens of times, and
// std::filesystem stops with "Too many levels of symbolic links", which names neither the link nor the loop. Such a
// link is an error naming the link and the folder it leads to. Loops are found by keeping the resolved path of every
// folder from `dir` down to the one being listed: a folder whose resolved path is among them closes a loop.
#include "data/file_walk.h"

#include <algorithm>
#include <system_error>

#include "hadatrain/core/error.h"

namespace ht::data {

namespace fs = std::filesystem;

std::vector<fs::path> files_under(const fs::path& dir, const std::string& what) {
  std::vector<fs::path> files;
  std::error_code ec;
  std::vector<fs::path> inside{fs::canonical(dir, ec)};  // resolved folders from `dir` down to the one listed
  HT_CHECK(!ec, "{}: cannot resolve {}: {}", what, dir.string(), ec.message());
  fs::path listing = dir;  // the folder whose entries come next, for an error while listing it
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path& path = it->path();
    inside.resize(static_cast<std::size_t>(it.depth()) + 1);
    std::error_code st;
    const fs::file_status status = it->status(st);  // through links
    if (st && status.type() == fs::file_type::not_found) continue;  // a dangling link: no file to read
    HT_CHECK(!st, "{}: cannot read {}: {}", what, path.string(), st.message());
    if (fs::is_directory(status)) {
      fs::path real = fs::canonical(path, st);
      HT_CHECK(!st, "{}: cannot resolve {}: {}", what, path.string(), st.message());
      HT_CHECK(std::find(inside.begin(), inside.end(), real) == inside.end(),
               "{}: {} is a symbolic link loop: it leads to {}, a folder the scan is already in, so following it "
               "would list the same files without end; remove the link or point it elsewhere",
               what, path.string(), real.string());
      inside.push_back(std::move(real));
      listing = path;
      continue;
    }
    if (fs::is_regular_file(status)) files.push_back(path);
  }
  HT_CHECK(!ec, "{}: cannot list {}: {}", what, listing.string(), ec.message());
  return files;
}

}  // namespace ht::data
