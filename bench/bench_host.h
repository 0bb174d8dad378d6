#pragma once
// What a benchmark's header says about the machine it ran on: the CPU's model and vector
// features (from /proc/cpuinfo) and the load average (from /proc/loadavg). Shared by benches.

#include <fstream>
#include <initializer_list>
#include <string>

namespace tessel::bench {

// "1.23 0.98 0.75": the 1, 5 and 15 minute load averages.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// "<model name>; f1 f2 ...": the CPU's model and those of `features` (cpuinfo flag names) it
// reports.
inline std::string cpu_features(std::initializer_list<const char*> features) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line) && (model.empty() || flags.empty())) {
    if (line.rfind("model name", 0) == 0) model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0) flags = " " + line.substr(line.find(':') + 2) + " ";
  }
  std::string out = model + ";";
  for (const char* f : features) {
    if (flags.find(" " + std::string(f) + " ") != std::string::npos) out += " " + std::string(f);
  }
  return out;
}

}  // namespace tessel::bench
