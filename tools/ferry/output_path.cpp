// output_path.cpp — an output file named on the command line, checked before the work that fills it.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "commands.h"
#include "ferry/error.h"

void check_writable(const std::string& path, const char* option) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(path).parent_path();
  const fs::path folder = parent.empty() ? fs::path(".") : parent;
  const std::string shown = ferry::detail::printable(path), folder_shown = ferry::detail::printable(folder.string());
  std::error_code error;
  FERRY_CHECK(!fs::is_directory(path, error), InvalidArgument, option, " ", shown,
              " is a folder (this is a directory, not a file); give a file name");
  FERRY_CHECK(fs::is_directory(folder, error), InvalidArgument, option, " ", shown, ": the folder '", folder_shown,
              "' ", fs::exists(folder, error) ? "is not a folder" : "does not exist");
  const bool exists = fs::exists(path, error);
  FERRY_CHECK(access(exists ? path.c_str() : folder.c_str(), W_OK) == 0, InvalidArgument, option, " ", shown,
              exists ? std::string(" cannot be written (") : ": the folder '" + folder_shown + "' is not writable (",
              std::strerror(errno), ")");
}
