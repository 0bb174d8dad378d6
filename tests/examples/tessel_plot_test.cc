// tessel-plot as a user runs it: two train_gpt-style logs become one SVG that parses as XML and
// holds a panel per metric with a series per run, a legend with both runs and labelled axes;
// bad input (a malformed line, a missing file, no series, an output it cannot write) gives one
// line naming the file (and line) and the documented exit status.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TesselPlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tessel_plot_test_{}", ::getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs tessel-plot with `args` (each single-quoted) in the scratch folder.
  Result plot(const std::vector<std::string>& args) {
    std::string command = fmt::format("cd '{}' && '{}'", dir_.string(), TESSEL_PLOT_PATH);
    for (const std::string& a : args) command += " '" + a + "'";
    command += " >out.txt 2>err.txt";
    const int raw = std::system(command.c_str());
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(dir_ / "out.txt"),
            slurp(dir_ / "err.txt")};
  }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }

  // A log as train_gpt --log-json writes it: a line per step, a val_loss line every 10 steps.
  void write_run(const std::string& name, int steps, double scale) {
    std::string text;
    for (int s = 1; s <= steps; ++s) {
      text += fmt::format(
          "{{\"step\": {}, \"loss\": {:.6f}, \"grad_norm\": {:.6f}, \"lr\": {:.6g}, "
          "\"tokens_per_s\": {:.1f}, \"peak_memory_bytes\": {}}}\n",
          s, 5.5 * scale / s + 1, 1.0 + 0.01 * s, 3e-3 * s / steps, 20000.0 + 100 * s,
          static_cast<int64_t>(9.0 * scale * 1048576));
      if (s % 10 == 0) text += fmt::format("{{\"step\": {}, \"val_loss\": {:.6f}}}\n", s, 2.0 / s);
    }
    write(name, text);
  }

  fs::path dir_;
};

// The attribute `name` of `node`, or "".
std::string attr(xmlNode* node, const char* name) {
  xmlChar* value = xmlGetProp(node, reinterpret_cast<const xmlChar*>(name));
  if (value == nullptr) return "";
  std::string out(reinterpret_cast<char*>(value));
  xmlFree(value);
  return out;
}

std::string text_of(xmlNode* node) {
  xmlChar* value = xmlNodeGetContent(node);
  std::string out(reinterpret_cast<char*>(value));
  xmlFree(value);
  return out;
}

// Every element under `node` (depth first) named `tag`.
void collect(xmlNode* node, const std::string& tag, std::vector<xmlNode*>& out) {
  for (xmlNode* n = node; n != nullptr; n = n->next) {
    if (n->type != XML_ELEMENT_NODE) continue;
    if (tag == reinterpret_cast<const char*>(n->name)) out.push_back(n);
    collect(n->children, tag, out);
  }
}

std::vector<xmlNode*> elements(xmlNode* node, const std::string& tag) {
  std::vector<xmlNode*> out;
  collect(node->children, tag, out);
  return out;
}

TEST_F(TesselPlotTest, TwoRunsGiveAnSvgWithEverySeriesBothRunsAndLabelledAxes) {
  write_run("single.jsonl", 40, 1.0);
  write_run("sharded.jsonl", 40, 1.1);
  const Result r = plot({"single.jsonl", "sharded.jsonl", "-o", "runs.svg"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "tessel-plot: wrote runs.svg (2 runs, 6 panels)\n");

  xmlDoc* doc = xmlReadFile((dir_ / "runs.svg").c_str(), nullptr, XML_PARSE_NONET);
  ASSERT_NE(doc, nullptr) << "runs.svg is not well-formed XML";
  xmlNode* root = xmlDocGetRootElement(doc);
  EXPECT_STREQ(reinterpret_cast<const char*>(root->name), "svg");

  std::set<std::string> legend;
  for (xmlNode* g : elements(root, "g")) {
    if (attr(g, "class") == "legend") legend.insert(attr(g, "data-run"));
  }
  EXPECT_EQ(legend, (std::set<std::string>{"single", "sharded"}));

  // A panel per metric, in order, each with both runs, "step" under it, a title and ticks.
  const std::vector<std::string> metrics = {"loss", "val_loss",     "grad_norm",
                                            "lr",   "tokens_per_s", "peak_memory_bytes"};
  std::vector<std::string> seen;
  for (xmlNode* g : elements(root, "g")) {
    if (attr(g, "class") != "panel") continue;
    const std::string metric = attr(g, "data-metric");
    seen.push_back(metric);
    SCOPED_TRACE(metric);
    std::map<std::string, size_t> points;  // run -> points in its polyline
    for (xmlNode* line : elements(g, "polyline")) {
      EXPECT_EQ(attr(line, "data-metric"), metric);
      const std::string coords = attr(line, "points");
      points[attr(line, "data-run")] = std::count(coords.begin(), coords.end(), ',');
    }
    const size_t expected = metric == "val_loss" ? 4 : 40;
    EXPECT_EQ(points, (std::map<std::string, size_t>{{"single", expected}, {"sharded", expected}}));
    int x_labels = 0, y_labels = 0, ticks = 0;
    for (xmlNode* t : elements(g, "text")) {
      const std::string cls = attr(t, "class");
      if (cls == "x-label") x_labels += text_of(t) == "step";
      if (cls == "y-label") y_labels += !text_of(t).empty();
      if (cls == "tick") ++ticks;
    }
    EXPECT_EQ(x_labels, 1);
    EXPECT_EQ(y_labels, 1);
    EXPECT_GE(ticks, 4);  // at least two on each axis
  }
  EXPECT_EQ(seen, metrics);
  xmlFreeDoc(doc);
}

TEST_F(TesselPlotTest, LabelsTitleAndALogWithoutValidation) {
  write("a.jsonl", "{\"step\": 1, \"loss\": 3.0}\n\n{\"step\": 2, \"loss\": 2.5, \"x\": \"y\"}\n");
  const Result r = plot({"a.jsonl", "--label", "lr <3e-3> & co", "--title", "one", "-o", "a.svg"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "tessel-plot: wrote a.svg (1 run, 1 panels)\n");
  const std::string svg = slurp(dir_ / "a.svg");
  EXPECT_NE(svg.find("data-run=\"lr &lt;3e-3&gt; &amp; co\""), std::string::npos);
  xmlDoc* doc = xmlReadMemory(svg.data(), static_cast<int>(svg.size()), "a.svg", nullptr, 0);
  ASSERT_NE(doc, nullptr);
  xmlFreeDoc(doc);
}

struct BadInput {
  std::string name;
  std::vector<std::string> args;
  int status;
  std::string names;  // what the one line must say
};

TEST_F(TesselPlotTest, BadInputGivesOneLineAndTheDocumentedStatus) {
  write_run("good.jsonl", 5, 1.0);
  write("malformed.jsonl", "{\"step\": 1, \"loss\": 3.0}\n{\"step\": 2, \"loss\": 2.\n");
  write("nostep.jsonl", "{\"step\": 1, \"loss\": 3.0}\n\n{\"loss\": 2.0}\n");
  write("array.jsonl", "[1, 2]\n");
  write("text.jsonl", "{\"step\": 1, \"loss\": \"low\"}\n");
  write("noseries.jsonl", "{\"step\": 1}\n{\"step\": 2, \"epoch\": 0}\n");
  write("empty.jsonl", "");
  const std::vector<BadInput> cases = {
      {"malformed line",
       {"good.jsonl", "malformed.jsonl", "-o", "x.svg"},
       65,
       "malformed.jsonl:2: "},
      {"no step",
       {"nostep.jsonl", "-o", "x.svg"},
       65,
       "nostep.jsonl:3: expected a numeric \"step\""},
      {"not an object",
       {"array.jsonl", "-o", "x.svg"},
       65,
       "array.jsonl:1: expected a JSON object"},
      {"not a number", {"text.jsonl", "-o", "x.svg"}, 65, "text.jsonl:1: \"loss\" is \"low\""},
      {"no series", {"noseries.jsonl", "-o", "x.svg"}, 65, "noseries.jsonl: no series"},
      {"empty file", {"empty.jsonl", "-o", "x.svg"}, 65, "empty.jsonl: no series"},
      {"missing file",
       {"good.jsonl", "missing.jsonl", "-o", "x.svg"},
       66,
       "missing.jsonl: cannot open it"},
      {"png", {"good.jsonl", "-o", "x.png"}, 65, "-o 'x.png': PNG is not built in"},
      {"other extension", {"good.jsonl", "-o", "x.pdf"}, 65, "-o 'x.pdf': expected"},
      {"unwritable", {"good.jsonl", "-o", "no/such/dir/x.svg"}, 73, "cannot write it"},
      {"labels",
       {"good.jsonl", "--label", "a", "--label", "b", "-o", "x.svg"},
       65,
       "2 --label for 1 logs"},
      {"no logs", {"-o", "x.svg"}, 64, "tessel-plot: "},
      {"no output", {"good.jsonl"}, 64, "tessel-plot: "},
      {"unknown flag", {"good.jsonl", "-o", "x.svg", "--png"}, 64, "unknown flag '--png'"},
  };
  for (const BadInput& bad : cases) {
    SCOPED_TRACE(bad.name);
    const Result r = plot(bad.args);
    EXPECT_EQ(r.status, bad.status) << r.err;
    EXPECT_EQ(r.out, "");
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
    EXPECT_TRUE(r.err.starts_with("tessel-plot: ")) << r.err;
    EXPECT_NE(r.err.find(bad.names), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "x.svg"));
}

}  // namespace
