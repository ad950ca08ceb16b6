// Walking a folder tree the way Python's os.walk(followlinks=True) does, which torchvision's ImageFolder and most
// text-corpus scripts use: symbolic links to files and folders are followed, so datasets made of links into one
// shared copy read as if the files were there. Internal to src/data (image folders, the token store's sources).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace ht::data {

// Every regular file under `dir`, recursively and through symbolic links, in the order found (callers sort). A
// folder reached by two links is listed twice, as os.walk lists it; a dangling link is skipped (no file to read).
// A link that leads back into a folder the walk is already in (the one that holds it, one above it, or one the walk
// came through by another link) would make the walk endless: it is an ht::Error naming the link, as the walk
// reached it, and the folder it leads to; so is an entry whose links cannot be resolved at all (a link to
// itself). Every error starts with `what` ("image folder /data/imagenet").
std::vector<std::filesystem::path> files_under(const std::filesystem::path& dir, const std::string& what);

}  // namespace ht::data
