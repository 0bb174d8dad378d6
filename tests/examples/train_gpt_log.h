#pragma once
// The losses a train_gpt --log-json file holds, by step (its lines are JSON objects; those with
// a "loss"). For the train_gpt tests that compare runs; needs nlohmann_json.

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace train_gpt_test {

inline std::map<int, double> logged_losses(const std::filesystem::path& file) {
  std::map<int, double> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

}  // namespace train_gpt_test
