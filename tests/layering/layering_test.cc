// Enforces the layer graph of DESIGN.md: a folder may include headers only from the folders it
// depends on (directly or through others), and its CMake target may link only to those.
//
//   base <- tensor <- kernels <- nn
//   base <- flight_recorder
//   base, tensor <- data
//   base, tensor, flight_recorder <- collectives <- mesh <- parallel (also nn, kernels)
//   collectives, flight_recorder <- launcher

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Graph = std::map<std::string, std::set<std::string>>;

// Direct dependencies, as drawn in DESIGN.md.
const Graph& design_graph() {
  static const Graph graph = {
      {"base", {}},
      {"tensor", {"base"}},
      {"kernels", {"tensor"}},
      {"nn", {"kernels"}},
      {"flight_recorder", {"base"}},
      {"data", {"base", "tensor"}},
      {"collectives", {"base", "tensor", "flight_recorder"}},
      {"mesh", {"collectives"}},
      {"parallel", {"mesh", "nn", "kernels"}},
      {"launcher", {"collectives", "flight_recorder"}},
  };
  return graph;
}

// The folder itself plus everything reachable from it.
std::set<std::string> allowed(const Graph& graph, const std::string& folder) {
  std::set<std::string> seen = {folder};
  std::vector<std::string> todo = {folder};
  while (!todo.empty()) {
    const std::string f = todo.back();
    todo.pop_back();
    for (const auto& dep : graph.at(f)) {
      if (seen.insert(dep).second) todo.push_back(dep);
    }
  }
  return seen;
}

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Every include of another tessel folder that the graph does not allow, and every include that
// climbs out of its folder with "../" (which would hide a layer crossing from this check).
std::vector<std::string> include_violations(const fs::path& root, const Graph& graph) {
  static const std::regex tessel_include(R"(^\s*#\s*include\s*[<"]tessel/([A-Za-z_]+)/)");
  static const std::regex parent_include(R"(^\s*#\s*include\s*"\.\./)");
  std::vector<std::string> violations;
  for (const auto& [folder, deps] : graph) {
    const fs::path dir = root / folder;
    if (!fs::exists(dir)) continue;
    const std::set<std::string> ok = allowed(graph, folder);
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() ||
          (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh" && ext != ".in")) {
        continue;
      }
      std::ifstream in(entry.path());
      std::string line;
      for (int number = 1; std::getline(in, line); ++number) {
        const std::string where =
            fs::relative(entry.path(), root).string() + ":" + std::to_string(number);
        std::smatch m;
        if (std::regex_search(line, m, tessel_include)) {
          const std::string target = m[1];
          if (graph.count(target) && !ok.count(target)) {
            violations.push_back(where + " includes tessel/" + target + "/, but " + folder +
                                 " may include only: " + join(ok));
          }
        } else if (std::regex_search(line, parent_include)) {
          violations.push_back(where + " includes a path with \"../\"; use \"tessel/<folder>/\"");
        }
      }
    }
  }
  return violations;
}

// Link dependencies declared in CMake ("folder: dep dep" per line) that the graph does not allow.
std::vector<std::string> cmake_violations(std::istream& layers, const Graph& graph) {
  std::vector<std::string> violations;
  std::string line;
  while (std::getline(layers, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string folder = line.substr(0, colon);
    if (!graph.count(folder)) {
      violations.push_back("CMake declares library '" + folder +
                           "', which DESIGN.md does not have");
      continue;
    }
    const std::set<std::string> ok = allowed(graph, folder);
    std::istringstream deps(line.substr(colon + 1));
    for (std::string dep; deps >> dep;) {
      if (!ok.count(dep)) {
        violations.push_back("CMake links " + folder + " to " + dep + ", but " + folder +
                             " may depend only on: " + join(ok));
      }
    }
  }
  return violations;
}

std::string listing(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += "  " + s + "\n";
  return out;
}

TEST(LayeringTest, SourceTreeIncludesFollowTheGraph) {
  const auto violations = include_violations(TESSEL_SOURCE_DIR, design_graph());
  EXPECT_TRUE(violations.empty()) << "layer violations:\n" << listing(violations);
}

TEST(LayeringTest, CMakeDependenciesFollowTheGraph) {
  std::ifstream layers(TESSEL_LAYERS_FILE);
  ASSERT_TRUE(layers) << "missing " << TESSEL_LAYERS_FILE;
  const auto violations = cmake_violations(layers, design_graph());
  EXPECT_TRUE(violations.empty()) << "layer violations:\n" << listing(violations);
}

// The checker itself: a planted tree with one allowed include and three forbidden ones.
TEST(LayeringTest, CatchesPlantedViolations) {
  const fs::path root =
      fs::temp_directory_path() / ("tessel_layering_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "tensor");
  fs::create_directories(root / "base");
  fs::create_directories(root / "collectives");
  std::ofstream(root / "tensor" / "ok.h") << "#include \"tessel/base/error.h\"\n";
  std::ofstream(root / "tensor" / "bad.h") << "// a tensor that knows modules\n"
                                              "#include \"tessel/nn/module.h\"\n";
  std::ofstream(root / "base" / "bad.cc") << "#include <tessel/tensor/tensor.h>\n";
  std::ofstream(root / "collectives" / "sneaky.cc") << "#include \"../mesh/device_mesh.h\"\n";

  const auto violations = include_violations(root, design_graph());
  fs::remove_all(root);
  ASSERT_EQ(violations.size(), 3u) << listing(violations);
  const std::string all = listing(violations);
  EXPECT_NE(
      all.find("tensor/bad.h:2 includes tessel/nn/, but tensor may include only: base, tensor"),
      std::string::npos)
      << all;
  EXPECT_NE(all.find("base/bad.cc:1 includes tessel/tensor/"), std::string::npos) << all;
  EXPECT_NE(all.find("collectives/sneaky.cc:1 includes a path with \"../\""), std::string::npos)
      << all;

  std::istringstream layers("base: \ntensor: base\nkernels: nn\nmesh: launcher\n");
  const auto link = cmake_violations(layers, design_graph());
  ASSERT_EQ(link.size(), 2u) << listing(link);
  EXPECT_NE(link[0].find("CMake links kernels to nn"), std::string::npos) << listing(link);
  EXPECT_NE(link[1].find("CMake links mesh to launcher"), std::string::npos) << listing(link);
}

}  // namespace
