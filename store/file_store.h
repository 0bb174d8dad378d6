#pragma once
// FileStore: a Store over a directory that every rank can reach (one host's /tmp, or a shared
// filesystem), like c10d's FileStore. One file per key, written to a temporary name and renamed
// into place, so readers never see half a value; add and compare_set hold an flock'd lock file;
// blocking get/wait poll with a short backoff until their deadline.
//
//   auto store = std::make_shared<FileStore>("/tmp/job-42");
//   store->set("addr/0", "...");
//   std::string v = store->get("addr/1", std::chrono::seconds(30));
//
// Thread-safe and process-safe. The directory is created when missing and never removed.

#include <string>

#include "tessel/store/store.h"

namespace tessel {

class FileStore final : public Store {
 public:
  // Throws IoError when the directory cannot be created.
  explicit FileStore(std::string directory,
                     Nanoseconds default_timeout = std::chrono::seconds(300));

  const std::string& directory() const { return directory_; }

  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::string get(const std::string& key, Nanoseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Nanoseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Nanoseconds timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

 private:
  std::string path_of(const std::string& key) const;
  void write_atomically(const std::string& key, const std::string& value);

  std::string directory_;
};

}  // namespace tessel
