#pragma once
// Reading dumps without keeping their entries: each entry goes to a sink as it is parsed, so a
// caller can digest a thousand full rings in memory that does not grow with them.
// read_dump_dir is this with sinks that keep every entry.
//
// Thread-safe: free functions; each sink is used by one thread at a time.

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/flight_recorder/reader.h"

namespace tessel::fr::internal {

// Receives one dump's entries, oldest first, then the dump itself. One sink per dump.
class EntrySink {
 public:
  virtual ~EntrySink() = default;
  virtual void add(TraceEntry&& entry) = 0;
  // The dump parsed completely; `dump` holds everything but the entries. The sink may take
  // what it wants from it (the reader keeps the rest).
  virtual void finish(RankDump& dump) = 0;
};

// The whole file; throws IoError naming it.
std::string read_file_bytes(const std::filesystem::path& file);
// Runs work(i) for every i in [0, n) on up to 8 threads, the calling one included: a thousand
// dumps are mostly JSON parsing.
void parallel_for(size_t n, const std::function<void(size_t)>& work);

// parse_dump with the entries handed to `sink` (RankDump::entries stays empty). finish() is
// not called: the caller decides when the dump is complete.
RankDump parse_dump_into(std::string_view text, const std::string& name, EntrySink& sink);

struct StreamedDumps {
  DumpSet set;  // as read_dump_dir's, with every RankDump::entries empty
  std::vector<std::unique_ptr<EntrySink>> sinks;  // parallel to set.dumps
  std::vector<std::filesystem::path> files;       // parallel to set.dumps
  // A dump whose sink was finished was then set aside (its rank is dumped twice, or its world
  // size disagrees): whatever the sinks share has seen it.
  bool finished_then_rejected = false;
};

// read_dump_dir's rules (which files, which become problems), with each dump's entries going
// to a sink made by `make_sink` (called from the reading threads) and finished there. `only`,
// when not empty: read just these files of `dir`. Throws as read_dump_dir.
StreamedDumps stream_dump_dir(const std::filesystem::path& dir, int world_size_hint,
                              const std::function<std::unique_ptr<EntrySink>()>& make_sink,
                              const std::vector<std::filesystem::path>& only = {});

}  // namespace tessel::fr::internal
