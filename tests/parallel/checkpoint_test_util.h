#pragma once
// Helpers shared by the checkpoint tests: a temporary folder that removes itself.

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace tessel::testing {

// A fresh folder under the system's temporary directory, removed with everything in it when
// the object goes out of scope.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tessel-ckpt-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tessel::testing
