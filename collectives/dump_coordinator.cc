#include "tessel/collectives/dump_coordinator.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/watchdog.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/flight_recorder/run_id.h"

namespace tessel {

DumpCoordinator::DumpCoordinator(std::shared_ptr<Store> store, fr::Dumper& dumper, int rank,
                                 DumpCoordinatorOptions options)
    : store_(std::move(store)), dumper_(dumper), rank_(rank), options_(options) {
  TESSEL_CHECK(store_ != nullptr, InvalidArgument, "DumpCoordinator needs the job's store");
}

DumpCoordinator::~DumpCoordinator() { stop(); }

void DumpCoordinator::start() {
  if (thread_.joinable()) return;
  // Requests already made (an earlier attempt of the job) are not ours; every one made after
  // start() returns is answered.
  const int64_t seen = store_->add(std::string(fr::kStoreDumpCounterKey), 0);
  // Tells a launcher that this rank answers dump requests (it waits for none that do not).
  store_->set(fr::store_ready_key(rank_), std::to_string(::getpid()));
  {
    std::lock_guard lock(mutex_);
    stop_ = false;
    watching_ = true;  // before the thread exists: a request made now waits for its post
  }
  thread_ = std::thread([this, seen] { run(seen); });
}

void DumpCoordinator::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    watching_ = false;
  }
  stopping_.notify_all();
  posted_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DumpCoordinator::on_timeout(const std::string& reason) {
  const int64_t now_us = fr::FlightRecorder::global().wall_now_us();
  dumper_.notify_timeout(rank_, reason);
  std::unique_lock lock(mutex_);
  if (!pending_) pending_ = reason;
  if (!failed_at_us_) failed_at_us_ = now_us;  // the first failure, by this rank's clock
  // The caller learns of the failure only after this returns, and a program that does not catch
  // it dies at once (std::terminate skips every destructor): wait, boundedly, until the watcher
  // has asked the other ranks to dump, or nobody else ever will.
  const uint64_t want = posted_ + 1;
  if (watching_ && !stop_) {
    posted_cv_.wait_for(lock, options_.post_bound, [&] { return posted_ >= want || stop_; });
  }
}

void DumpCoordinator::answer(int64_t n, const std::string& value) {
  fr::DumpRequest request = fr::decode_store_dump_request(value);
  const auto path = dumper_.dump_now(request);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  store_->set(fr::store_dump_key(n, rank_), text.str());
  answered_++;
  log_info(LogComponent::kCollectives, "dump request {} from rank {} answered: {}", n,
           request.initiator, path.string());
}

void DumpCoordinator::run(int64_t seen) {
  bool warned = false;
  std::set<int64_t> own;  // requests this rank posted and answered itself
  for (;;) {
    std::optional<std::string> post;
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      post.swap(pending_);
      stopping = stop_;
    }
    if (stopping && !post) return;
    try {
      if (post) {
        // Record when this rank's collective failed (the launcher orders failures by these
        // times, not by exit order), then post, and answer at once: a rank whose collective
        // failed may exit right after.
        int64_t failed_at = 0;
        {
          std::lock_guard lock(mutex_);
          failed_at = failed_at_us_.value_or(0);
        }
        if (!failure_posted_) {
          store_->set(fr::store_failure_key(rank_), fr::encode_store_failure(failed_at, *post));
          failure_posted_ = true;
        }
        const int64_t n = store_->add(std::string(fr::kStoreDumpCounterKey), 1);
        const std::string value = fr::encode_store_dump_request(rank_, *post);
        store_->set(fr::store_dump_request_key(n), value);
        post.reset();
        {
          std::lock_guard lock(mutex_);
          ++posted_;
        }
        posted_cv_.notify_all();
        answer(n, value);
        own.insert(n);
        continue;
      }
      const std::string key = fr::store_dump_request_key(seen + 1);
      try {
        store_->wait({key}, options_.poll);
      } catch (const Timeout&) {
        continue;
      }
      const std::string value = store_->get(key, options_.poll);
      ++seen;
      if (!own.erase(seen)) answer(seen, value);
      warned = false;
    } catch (const Error& e) {
      // A store that went away or a malformed request: say so once and keep watching, backing
      // off for one poll, so a later request still gets an answer. A request not yet posted
      // when stopping is dropped: stop() must not wait on a dead store.
      if (!warned) {
        log_warn(LogComponent::kCollectives, "flight-recorder dump coordination: {}", e.what());
        warned = true;
      }
      std::unique_lock lock(mutex_);
      if (stop_) return;
      if (post && !pending_) pending_ = std::move(post);
      stopping_.wait_for(lock, options_.poll, [this] { return stop_; });
    }
  }
}

namespace {

// The job's run id: the launcher's (fr::run_id_from_env), else the first rank's
// "pid-<pid>-<host>" shared through the store, else this process's own.
std::string resolve_run_id(Store* store) {
  if (std::string id = fr::run_id_from_env(); !id.empty()) return id;
  char host[64] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  const std::string own = fr::sanitize_run_id(fmt::format("pid-{}-{}", ::getpid(), host));
  if (store == nullptr) return own;
  try {
    return fr::sanitize_run_id(store->compare_set("tessel/fr/run_id", "", own));
  } catch (const Error& e) {
    log_warn(LogComponent::kCollectives, "flight recorder: run id not shared ({}); using {}",
             e.what(), own);
    return own;
  }
}

// The process's dumper and coordinator; destroyed at exit in the safe order.
struct DumpRuntime {
  std::unique_ptr<fr::Dumper> dumper;
  std::unique_ptr<DumpCoordinator> coordinator;
  ~DumpRuntime() {
    if (!dumper) return;
    Watchdog::global().set_dump_hook(nullptr);
    if (coordinator) coordinator->stop();
    dumper->stop();
  }
};

}  // namespace

void enable_flight_recorder_dumps(std::shared_ptr<Store> store, int rank, int world_size) {
  static std::mutex mutex;
  // Constructed before the runtime, so destroyed after it: its destructor unhooks the watchdog.
  Watchdog& watchdog = Watchdog::global();
  static DumpRuntime runtime;
  std::lock_guard lock(mutex);
  if (runtime.dumper) return;
  fr::FlightRecorder& recorder = fr::FlightRecorder::global();
  const std::string run_id = resolve_run_id(store.get());
  recorder.set_run_id(run_id);  // before the rank, so a ring file is renamed once
  recorder.set_process_info(rank, world_size);
  runtime.dumper = std::make_unique<fr::Dumper>(recorder, fr::DumperOptions::from_env(run_id));
  runtime.dumper->start();
  if (!store) {
    // No store (e.g. MPI without one): this rank still dumps on its own timeouts and signals.
    watchdog.set_dump_hook([d = runtime.dumper.get(), rank](const WatchdogEvent& event) {
      d->notify_timeout(rank, event.reason);
    });
    return;
  }
  runtime.coordinator = std::make_unique<DumpCoordinator>(std::move(store), *runtime.dumper, rank);
  runtime.coordinator->start();
  watchdog.set_dump_hook([c = runtime.coordinator.get()](const WatchdogEvent& event) {
    // The kind leads the reason ("Timeout: ...", "PeerLost: ..."): a launcher tells a timeout
    // from its consequences by it.
    const std::string kind = fmt::format("{}: ", error_kind_name(event.kind));
    c->on_timeout(event.reason.rfind(kind, 0) == 0 ? event.reason : kind + event.reason);
  });
}

}  // namespace tessel
