#include "tessel/flight_recorder/dump.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <system_error>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/flight_recorder/internal/dump_format.h"

namespace tessel::fr {

std::string_view trigger_name(DumpTrigger trigger) {
  switch (trigger) {
    case DumpTrigger::kApi:
      return "api";
    case DumpTrigger::kTimeout:
      return "timeout";
    case DumpTrigger::kStoreRequest:
      return "store_request";
    case DumpTrigger::kSignal:
      return "signal";
    case DumpTrigger::kError:
      return "error";
    case DumpTrigger::kFatalSignal:
      return "fatal_signal";
    case DumpTrigger::kRecovered:
      return "recovered";
  }
  return "unknown";
}

std::optional<DumpTrigger> parse_trigger(std::string_view name) {
  for (auto t :
       {DumpTrigger::kApi, DumpTrigger::kTimeout, DumpTrigger::kStoreRequest, DumpTrigger::kSignal,
        DumpTrigger::kError, DumpTrigger::kFatalSignal, DumpTrigger::kRecovered}) {
    if (trigger_name(t) == name) return t;
  }
  return std::nullopt;
}

std::string dump_file_name(int rank, int pid) {
  return rank >= 0 ? fmt::format("tessel_fr_rank{}.json", rank)
                   : fmt::format("tessel_fr_pid{}.json", pid);
}

namespace internal {
namespace {

void format_tensor(JsonSink& s, const TensorMeta& t) noexcept {
  s.raw("{").key("dtype", true).str(std::string_view(t.dtype, strnlen(t.dtype, sizeof(t.dtype))));
  s.key("shape").raw("[");
  for (int i = 0; i < t.ndim && i < kMaxDims; ++i) {
    if (i > 0) s.raw(",");
    s.i64(t.shape[i]);
  }
  s.raw("]").key("numel").i64(t.numel).raw("}");
}

void format_entry(JsonSink& s, const Entry& e) noexcept {
  s.raw("\n{").key("record_id", true).u64(e.record_id);
  s.key("group_id").u64(e.group_id).key("seq").u64(e.seq);
  s.key("peer").i64(e.peer).key("p2p_seq").u64(e.p2p_seq);
  s.key("op").str(op_name(e.op)).key("reduce_op").str(reduce_op_text(e.reduce_op));
  s.key("root").i64(e.root).key("state").str(state_name(e.state));
  s.key("coalesced_id").u64(e.coalesced_id).key("coalesced_index").u64(e.coalesced_index);
  s.key("callsite_id").u64(e.callsite_id).key("step").i64(e.step);
  s.key("input");
  format_tensor(s, e.input);
  s.key("output");
  format_tensor(s, e.output);
  s.key("enqueued_ns").i64(e.enqueued_ns).key("started_ns").i64(e.started_ns);
  s.key("completed_ns").i64(e.completed_ns).key("thread_id").u64(e.thread_id);
  s.key("text").str(std::string_view(e.text, strnlen(e.text, sizeof(e.text))));
  s.key("purpose").str(std::string_view(e.purpose, strnlen(e.purpose, sizeof(e.purpose))));
  s.key("stack").raw("[");
  for (int i = 0; i < e.stack_depth && i < kMaxStackFrames; ++i) {
    if (i > 0) s.raw(",");
    s.hex(e.stack[i]);
  }
  s.raw("]}");
}

}  // namespace

void format_dump(const FlightRecorder& recorder, DumpTrigger trigger, int initiator,
                 const char* reason, JsonSink& s) noexcept {
  const ProcessInfo& p = recorder.process_info();
  // One time base for the dump: its "now" and every entry's times are converted together.
  const TimeBase time_base = recorder.time_base();
  s.raw("{").key("format", true).str(kDumpFormatName).key("version").i64(kDumpFormatVersion);
  s.key("rank").i64(p.rank).key("world_size").i64(p.world_size);
  s.key("hostname").str(std::string_view(p.hostname, strnlen(p.hostname, sizeof(p.hostname))));
  s.key("pid").i64(p.pid);
  s.key("run_id").str(std::string_view(p.run_id, strnlen(p.run_id, sizeof(p.run_id))));
  s.key("trigger").str(trigger_name(trigger)).key("initiator").i64(initiator);
  s.key("reason").str(reason == nullptr ? "" : std::string_view(reason, strlen(reason)));
  // The two clocks read together let a reader put every rank's timestamps on wall time.
  s.key("wall_time_us").i64(recorder.wall_now_us()).key("monotonic_ns").i64(time_base.now_ns());
  s.key("capacity").u64(recorder.capacity()).key("recorded").u64(recorder.recorded());
  s.key("step").i64(recorder.step()).key("stack_captured").boolean(recorder.captures_stack());
  s.key("groups").raw("[");
  bool first = true;
  recorder.for_each_group([&](const GroupInfo& g) {
    s.raw(first ? "\n{" : ",\n{").key("id", true).u64(g.id).key("name").str(g.name);
    s.key("ranks").raw("[");
    for (size_t i = 0; i < g.ranks.size(); ++i) {
      if (i > 0) s.raw(",");
      s.i64(g.ranks[i]);
    }
    s.raw("]}");
    first = false;
  });
  s.raw("]").key("dropped").raw("[");
  first = true;
  recorder.for_each_dropped([&](const GroupDrops& d) {
    s.raw(first ? "{" : ",{").key("group_id", true).u64(d.group_id);
    s.key("last_dropped_seq").u64(d.last_dropped_seq).key("dropped").u64(d.dropped).raw("}");
    first = false;
  });
  s.raw("]").key("entries").raw("[");
  const uint64_t newest = recorder.recorded();
  const uint64_t oldest = newest >= recorder.capacity() ? newest - recorder.capacity() + 1 : 1;
  Entry e;
  first = true;
  for (uint64_t id = oldest; id <= newest && newest > 0; ++id) {
    if (!recorder.read_entry(id, e, time_base)) continue;
    if (!first) s.raw(",");
    format_entry(s, e);
    first = false;
  }
  s.raw("]}\n");
}

int write_dump_file(const FlightRecorder& recorder, DumpTrigger trigger, int initiator,
                    const char* reason, const char* tmp_path, const char* final_path, char* buffer,
                    size_t size) noexcept {
  const int fd = ::open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  bool ok;
  {
    JsonSink sink(fd, buffer, size);
    format_dump(recorder, trigger, initiator, reason, sink);
    ok = sink.flush();
  }
  // No fsync: rename is atomic for every reader on the machine, and the page cache outlives the
  // process; only a machine crash could lose the dump, and then the job is lost anyway.
  int err = ok ? 0 : (errno != 0 ? errno : EIO);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp_path, final_path) != 0) err = errno;
  if (err != 0) ::unlink(tmp_path);
  return err;
}

}  // namespace internal

std::string dump_to_string(const FlightRecorder& recorder, const DumpRequest& request) {
  std::string out;
  char buffer[16384];
  {
    internal::JsonSink sink(&out, buffer, sizeof(buffer));
    internal::format_dump(recorder, request.trigger, request.initiator, request.reason.c_str(),
                          sink);
  }
  return out;
}

std::filesystem::path write_dump(const FlightRecorder& recorder, const DumpRequest& request,
                                 const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TESSEL_CHECK(!ec, IoError, "cannot create flight-recorder dump directory '{}': {}", dir.string(),
               ec.message());
  const ProcessInfo& p = recorder.process_info();
  const auto final_path = dir / dump_file_name(p.rank, p.pid);
  // Unique per writer so concurrent dumps of one process never share a temporary file.
  static std::atomic<uint64_t> counter{0};
  const auto tmp_path =
      dir / fmt::format(".{}.tmp.{}.{}", final_path.filename().string(), p.pid, counter++);
  constexpr size_t kBufferSize = 1 << 16;
  auto buffer = std::make_unique<char[]>(kBufferSize);
  const int err = internal::write_dump_file(recorder, request.trigger, request.initiator,
                                            request.reason.c_str(), tmp_path.c_str(),
                                            final_path.c_str(), buffer.get(), kBufferSize);
  if (err != 0) {
    throw_system_error(fmt::format("cannot write flight-recorder dump '{}'", final_path.string()),
                       err);
  }
  return final_path;
}

}  // namespace tessel::fr
