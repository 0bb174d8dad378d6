#pragma once
// Private: the file-system steps of a checkpoint's commit — durable writes (fsync'ed files and
// directories), exact positioned reads, the atomic rename into place — and the test hook that
// lets a test kill a rank at a named moment of a save. Every function throws IoError naming the
// path and the system's reason.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace tessel::checkpoint::internal {

// Creates `path` (truncating it), writes `pieces` one after the other and fsyncs it;
// fault_point("write.mid") halfway through the bytes (for the crash tests).
void write_file_durably(const std::string& path,
                        std::span<const std::span<const std::byte>> pieces);
// fsync of a directory, so the entries created or renamed in it survive a crash.
void fsync_dir(const std::string& dir);
// Reads exactly `bytes` at `offset` of the open file `fd` into `out`.
void pread_exact(int fd, void* out, uint64_t bytes, uint64_t offset, const std::string& path);
// Puts directory `from` at `to`: a rename when `to` does not exist; otherwise the two are
// exchanged atomically (renameat2 RENAME_EXCHANGE) and the old one, now at `from`, is removed.
// Then fsyncs the parent.
void replace_dir(const std::string& from, const std::string& to);
// Removes a tree, renaming it to a hidden name first when `hide_as` is given, so a crash while
// removing never leaves a half-removed folder under its old name.
void remove_tree(const std::string& path, const std::string& hide_as = {});

// Test hook: called on every rank at each named step of a save ("commit.begin", "write.begin",
// "write.mid", "write.end", "metadata.begin", "rename.begin", "rename.end", "retention.begin").
// Null by default; a test sets it before forking its ranks.
using FaultHook = std::function<void(std::string_view point)>;
void set_fault_hook(FaultHook hook);
void fault_point(std::string_view point);

}  // namespace tessel::checkpoint::internal
