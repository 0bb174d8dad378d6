// Uses the installed headers and libraries the way a training program would.
#include <cstdio>

#include <tessel/base/build_info.h>
#include <tessel/base/clock.h>
#include <tessel/base/error.h>
#include <tessel/base/logging.h>

int main() {
  using namespace tessel;
  std::printf("%s", build_info_text().c_str());
  try {
    parse_duration("soon");
    std::printf("consumer: parse_duration accepted 'soon'\n");
    return 1;
  } catch (const InvalidArgument& e) {
    std::printf("caught %s\n", e.what());
  }
  configure_logging("base=info");
  log_info(LogComponent::kBase, "logging from an installed tessel");
  std::printf("consumer: ok\n");
  return 0;
}
