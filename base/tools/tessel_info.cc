// tessel-info: prints what this build of tessel contains and the environment knobs it reads.
//   tessel-info                  build summary and knobs with their current values
//   tessel-info --knobs-markdown the knob table as Markdown (docs/environment.md is made from it)

#include <cstdio>
#include <string_view>

#include "tessel/base/build_info.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"

int main(int argc, char** argv) {
  using namespace tessel;
  bool markdown = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--knobs-markdown") {
      markdown = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: tessel-info [--knobs-markdown]\n"
          "Prints the build configuration and the TESSEL_* environment variables.\n\n"
          "Environment variables:\n%s",
          env_knobs_text().c_str());
      return 0;
    } else {
      std::fprintf(stderr, "tessel-info: unknown argument '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  try {
    init_logging();
  } catch (const Error& e) {
    std::fprintf(stderr, "tessel-info: %s\n", e.what());
    return 2;
  }
  if (markdown) {
    std::fputs(env_knobs_markdown().c_str(), stdout);
    return 0;
  }
  std::printf("%s\nEnvironment variables:\n%s", build_info_text().c_str(),
              env_knobs_text().c_str());
  return 0;
}
