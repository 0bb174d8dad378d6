// Enforces the layer graph of docs/architecture.md: a folder may include headers only from the
// folders it depends on (directly or through others), and its CMake target may link only to
// those; and a folder's private names (those declared in an `internal` namespace) are used only
// inside that folder.
//
//   base <- tensor <- kernels <- nn
//   base <- flight_recorder
//   base, tensor <- data
//   base <- store
//   base, tensor, flight_recorder, store <- collectives <- mesh <- parallel (also nn, kernels)
//   store, flight_recorder <- launcher

#include <gtest/gtest.h>

#include <cctype>
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

// Direct dependencies, as drawn in docs/architecture.md.
const Graph& design_graph() {
  static const Graph graph = {
      {"base", {}},
      {"tensor", {"base"}},
      {"kernels", {"tensor"}},
      {"nn", {"kernels"}},
      {"flight_recorder", {"base"}},
      {"data", {"base", "tensor"}},
      {"store", {"base"}},
      {"collectives", {"base", "tensor", "flight_recorder", "store"}},
      {"mesh", {"collectives"}},
      {"parallel", {"mesh", "nn", "kernels"}},
      {"launcher", {"store", "flight_recorder"}},
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
  static const std::regex internal_include(R"(^\s*#\s*include\s*[<"]tessel/[^>"]*/internal/)");
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
          } else if (target != folder && std::regex_search(line, internal_include)) {
            violations.push_back(where + " includes a private header of " + target +
                                 " (an internal/ folder); use its public API");
          }
        } else if (std::regex_search(line, parent_include)) {
          violations.push_back(where + " includes a path with \"../\"; use \"tessel/<folder>/\"");
        }
      }
    }
  }
  return violations;
}

bool is_source(const fs::path& path) {
  const std::string ext = path.extension().string();
  return ext == ".h" || ext == ".cc" || ext == ".cu" || ext == ".cuh";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text with comments, string and character literals (raw strings too) blanked out, line
// breaks kept: what is left is code, whose braces and names can be read by line.
std::string code_only(const std::string& text) {
  std::string out(text.size(), ' ');
  size_t i = 0;
  auto keep_newlines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < text.size(); ++k) {
      if (text[k] == '\n') out[k] = '\n';
    }
  };
  while (i < text.size()) {
    const char c = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    if (c == '/' && next == '/') {
      const size_t end = text.find('\n', i);
      i = end == std::string::npos ? text.size() : end;
    } else if (c == '/' && next == '*') {
      const size_t end = text.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? text.size() : end + 2;
      keep_newlines(i, stop);
      i = stop;
    } else if (c == 'R' && next == '"' && (i == 0 || !std::isalnum(text[i - 1]))) {
      const size_t open = text.find('(', i + 2);
      const std::string close = ")" + text.substr(i + 2, open - (i + 2)) + "\"";
      const size_t end = text.find(close, open);
      const size_t stop = end == std::string::npos ? text.size() : end + close.size();
      keep_newlines(i, stop);
      i = stop;
    } else if (c == '"' || (c == '\'' && !(i > 0 && std::isxdigit(text[i - 1])))) {
      size_t k = i + 1;  // a ' after a hex digit is a digit separator (1'000), not a literal
      while (k < text.size() && text[k] != c && text[k] != '\n') k += text[k] == '\\' ? 2 : 1;
      i = k + 1;
    } else {
      out[i] = c;
      ++i;
    }
  }
  return out;
}

// Names declared at the top level of `internal` namespaces in `code` (as code_only leaves it):
// types, aliases, functions, variables and constants.
std::set<std::string> declared_internal_names(const std::string& code) {
  static const std::regex open_namespace(R"(^\s*(?:inline\s+)?namespace\s*([\w:]*)\s*\{)");
  static const std::regex type_decl(
      R"(^\s*(?:template\s*<.*>\s*)?(?:class|struct|union|enum(?:\s+class)?)\s+(\w+))");
  static const std::regex alias_decl(R"(^\s*using\s+(\w+)\s*=)");
  static const std::regex function_or_variable(R"(^\s*[\w:<>,\*&\s]*?\b(\w+)\s*(?:\(|=|\{|;|\[))");
  std::set<std::string> names;
  struct Open {
    int depth;  // brace depth inside the namespace
    bool internal;
  };
  std::vector<Open> namespaces;
  int depth = 0;
  int parens = 0;
  std::istringstream lines(code);
  for (std::string line; std::getline(lines, line);) {
    const bool in_internal = !namespaces.empty() && namespaces.back().internal &&
                             namespaces.back().depth == depth && parens == 0;
    std::smatch m;
    if (std::regex_search(line, m, open_namespace)) {
      const std::string name = m[1];
      const bool internal = name == "internal" || name.ends_with("::internal") ||
                            (!namespaces.empty() && namespaces.back().internal);
      namespaces.push_back({depth + 1, internal});
    } else if (in_internal) {
      if (std::regex_search(line, m, type_decl) || std::regex_search(line, m, alias_decl) ||
          std::regex_search(line, m, function_or_variable)) {
        names.insert(m[1]);
      }
    }
    for (char c : line) {
      if (c == '{') ++depth;
      if (c == '(') ++parens;
      if (c == ')') --parens;
      if (c == '}') {
        --depth;
        if (!namespaces.empty() && depth < namespaces.back().depth) namespaces.pop_back();
      }
    }
  }
  return names;
}

// Uses of another folder's private names: `internal::Name` written in a file of one folder,
// where Name is declared in an internal namespace of another folder's headers and not of its
// own. (Tests and benchmarks, outside the graph's folders, may test internals.)
std::vector<std::string> internal_name_violations(const fs::path& root, const Graph& graph) {
  std::map<std::string, std::set<std::string>> declared;  // folder -> names (its headers)
  std::map<std::string, std::vector<fs::path>> files;     // folder -> its sources
  for (const auto& [folder, deps] : graph) {
    const fs::path dir = root / folder;
    if (!fs::exists(dir)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      files[folder].push_back(entry.path());
      const std::string ext = entry.path().extension().string();
      if (ext == ".h" || ext == ".cuh") {
        declared[folder].merge(declared_internal_names(code_only(read_text(entry.path()))));
      }
    }
  }
  static const std::regex use(R"(\binternal::(\w+))");
  std::vector<std::string> violations;
  for (const auto& [folder, paths] : files) {
    const std::set<std::string>& own = declared[folder];
    for (const fs::path& path : paths) {
      std::istringstream lines(code_only(read_text(path)));
      int number = 0;
      for (std::string line; std::getline(lines, line);) {
        ++number;
        for (std::sregex_iterator it(line.begin(), line.end(), use), end; it != end; ++it) {
          const std::string name = (*it)[1];
          if (own.count(name)) continue;
          for (const auto& [other, names] : declared) {
            if (other == folder || !names.count(name)) continue;
            violations.push_back(fs::relative(path, root).string() + ":" + std::to_string(number) +
                                 " uses internal::" + name + ", private to " + other +
                                 "; use its public API");
          }
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
                           "', which docs/architecture.md does not have");
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

TEST(LayeringTest, PrivateNamesStayInTheirFolder) {
  const auto violations = internal_name_violations(TESSEL_SOURCE_DIR, design_graph());
  EXPECT_TRUE(violations.empty()) << "private names used across folders:\n" << listing(violations);
}

// The internal-name checker: one folder's private class and function named from another folder
// (directly and through a namespace prefix), beside uses that are fine.
TEST(LayeringTest, CatchesPlantedUseOfAnotherFoldersInternals) {
  const fs::path root =
      fs::temp_directory_path() / ("tessel_layering_internal_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "store" / "internal");
  fs::create_directories(root / "flight_recorder" / "internal");
  fs::create_directories(root / "launcher");
  std::ofstream(root / "store" / "internal" / "gate.h")
      << "#pragma once\n"
         "namespace tessel::internal {\n"
         "// class NotAName is a comment; \"struct NotEither\" a string\n"
         "class ConnectionGate {\n"
         " public:\n"
         "  void authenticated(const char* peer);\n"
         "};\n"
         "int connection_limit(int x,\n"
         "                     int y);\n"
         "}  // namespace tessel::internal\n";
  std::ofstream(root / "store" / "gate.cc")
      << "namespace tessel {\nint f() { return internal::connection_limit(1, 2); }\n}\n";
  std::ofstream(root / "flight_recorder" / "internal" / "stream.h")
      << "namespace tessel::fr {\nnamespace internal {\n"
         "std::string read_file_bytes(const std::string& path);\n"
         "}  // namespace internal\nstd::string public_call();\n}  // namespace tessel::fr\n";
  std::ofstream(root / "launcher" / "server.cc")
      << "namespace tessel::launcher {\n"
         "internal::ConnectionGate* gate = nullptr;\n"           // private to store
         "auto bytes = fr::internal::read_file_bytes(\"x\");\n"  // private to flight_recorder
         "auto fine = fr::public_call();\n"
         "// internal::ConnectionGate in a comment is fine\n"
         "const char* text = \"internal::ConnectionGate\";\n"
         "}  // namespace tessel::launcher\n";
  const auto violations = internal_name_violations(root, design_graph());
  const auto includes = include_violations(root, design_graph());
  fs::remove_all(root);
  ASSERT_EQ(violations.size(), 2u) << listing(violations);
  const std::string all = listing(violations);
  EXPECT_NE(all.find("launcher/server.cc:2 uses internal::ConnectionGate, private to store"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("launcher/server.cc:3 uses internal::read_file_bytes, private to "
                     "flight_recorder"),
            std::string::npos)
      << all;
  EXPECT_TRUE(includes.empty()) << listing(includes);
}

// A folder including another folder's internal/ header is refused even where the graph allows
// the folder itself.
TEST(LayeringTest, CatchesPlantedIncludeOfAnotherFoldersInternalHeader) {
  const fs::path root =
      fs::temp_directory_path() / ("tessel_layering_private_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "launcher");
  fs::create_directories(root / "store");
  std::ofstream(root / "launcher" / "a.cc")
      << "#include \"tessel/store/store.h\"\n"
         "#include \"tessel/store/internal/store_service.h\"\n"
         "#include \"tessel/flight_recorder/internal/dump_stream.h\"\n"
         "#include \"tessel/collectives/process_group.h\"\n";
  std::ofstream(root / "store" / "b.cc") << "#include \"tessel/store/internal/store_table.h\"\n";
  const auto violations = include_violations(root, design_graph());
  fs::remove_all(root);
  ASSERT_EQ(violations.size(), 3u) << listing(violations);
  const std::string all = listing(violations);
  EXPECT_NE(all.find("launcher/a.cc:2 includes a private header of store"), std::string::npos)
      << all;
  EXPECT_NE(all.find("launcher/a.cc:3 includes a private header of flight_recorder"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("launcher/a.cc:4 includes tessel/collectives/, but launcher may include "
                     "only: base, flight_recorder, launcher, store"),
            std::string::npos)
      << all;
}

}  // namespace
