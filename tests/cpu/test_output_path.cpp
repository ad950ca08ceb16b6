// io::check_output_path: the outputs a command can write (a missing file or folder under a writable folder, an
// existing folder or file of the right kind) pass and nothing is created; a regular file in the way, a device or pipe where a file is wanted, a folder where
// a file is wanted, a dangling link and a folder that is not writable fail with the caller's name and the path.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/io/output_path.h"

using namespace ht;
using io::OutputKind;
namespace fs = std::filesystem;

TEST_CASE("output paths that can be written pass, and nothing is created", "[io][output_path]") {
  test::TempDir tmp("output_path_ok");
  std::ofstream(tmp.path / "old.json") << "{}";
  io::check_output_path(tmp.path / "a" / "b" / "report.json", OutputKind::file, "--json");
  io::check_output_path(tmp.path / "a" / "b", OutputKind::directory, "--output");
  io::check_output_path(tmp.path, OutputKind::directory, "--output");              // an existing folder
  io::check_output_path(tmp.path / "old.json", OutputKind::file, "--json");       // replaced atomically
  CHECK_FALSE(fs::exists(tmp.path / "a"));
  io::create_output_directory(tmp.path / "a" / "b", "--output");
  CHECK(fs::is_directory(tmp.path / "a" / "b"));
}

TEST_CASE("output paths that cannot be written name the flag and the path", "[io][output_path]") {
  test::TempDir tmp("output_path_bad");
  const fs::path file = tmp.path / "file";
  std::ofstream(file) << "x";
  const std::string f = file.string();
  // A device or a pipe would be replaced by a regular file (the rename of an atomic write), never written to.
  CHECK_THAT(test::error_of([&] { io::check_output_path("/dev/null", OutputKind::file, "--json"); }),
             HasSubstr("--json: /dev/null is not a regular file (a terminal, pipe or device)"));
  const fs::path fifo = tmp.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THAT(test::error_of([&] { io::check_output_path(fifo, OutputKind::file, "--json"); }),
             HasSubstr("is not a regular file"));
  fs::create_symlink(file, tmp.path / "link.json");  // a link to a regular file passes
  io::check_output_path(tmp.path / "link.json", OutputKind::file, "--json");
  CHECK_THAT(test::error_of([&] { io::check_output_path(file, OutputKind::directory, "--output"); }),
             HasSubstr("--output: " + f + " exists and is not a directory"));
  CHECK_THAT(test::error_of([&] { io::check_output_path(file / "x.json", OutputKind::file, "--json"); }),
             HasSubstr("--json: cannot create " + f + "/x.json: " + f + " is not a directory"));
  CHECK_THAT(test::error_of([&] { io::check_output_path(file / "a" / "b", OutputKind::directory, "run.out_dir"); }),
             HasSubstr("run.out_dir: cannot create " + f + "/a/b: " + f + " is not a directory"));
  CHECK_THAT(test::error_of([&] { io::check_output_path(tmp.path, OutputKind::file, "--json"); }),
             HasSubstr("--json: " + tmp.path.string() + " is a directory (expected a file name)"));
  CHECK_THAT(test::error_of([&] { io::check_output_path("", OutputKind::file, "--json"); }),
             HasSubstr("--json: the path is empty"));
  fs::create_symlink(tmp.path / "nowhere", tmp.path / "link");
  CHECK_THAT(test::error_of([&] { io::check_output_path(tmp.path / "link", OutputKind::directory, "--out-dir"); }),
             HasSubstr("--out-dir: " + (tmp.path / "link").string() + " is a symbolic link to"));
  CHECK_THAT(test::error_of([&] { io::create_output_directory(file / "d", "--output"); }),
             HasSubstr("--output: cannot create " + f + "/d: "));
  // A folder without write permission (root writes anyway: checked only when the permission holds).
  const fs::path locked = tmp.path / "locked";
  fs::create_directory(locked);
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(locked.c_str(), W_OK) != 0) {
    CHECK_THAT(test::error_of([&] { io::check_output_path(locked / "run", OutputKind::directory, "run.out_dir"); }),
               HasSubstr("run.out_dir: cannot create " + (locked / "run").string() + ": the folder " +
                          locked.string() + " is not writable"));
    CHECK_THAT(test::error_of([&] { io::check_output_path(locked, OutputKind::directory, "--output"); }),
               HasSubstr("--output: the folder " + locked.string() + " is not writable"));
  }
  fs::permissions(locked, fs::perms::owner_all);
}
