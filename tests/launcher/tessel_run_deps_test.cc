// tessel-run reaches the job's store through tessel::store alone: the program it is linked into
// loads neither the tensor library nor any collective backend (Gloo, MPI, NCCL, CUDA). ldd lists
// every shared library the dynamic loader would map, transitively.
#include <gtest/gtest.h>
#include <stdio.h>

#include <array>
#include <string>

namespace {

std::string ldd(const std::string& program) {
  std::string out;
  FILE* pipe = ::popen(("ldd '" + program + "' 2>&1").c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 4096> buffer;
  while (size_t n = ::fread(buffer.data(), 1, buffer.size(), pipe)) out.append(buffer.data(), n);
  ::pclose(pipe);
  return out;
}

TEST(TesselRunDependenciesTest, LinksTheStoreNotTensorsOrBackends) {
  const std::string libs = ldd(TESSEL_RUN_PATH);
  if (libs.find("not a dynamic executable") != std::string::npos || libs.empty()) {
    GTEST_SKIP() << "ldd cannot read " << TESSEL_RUN_PATH << ": " << libs;
  }
  EXPECT_NE(libs.find("libtessel_store"), std::string::npos) << libs;
  EXPECT_NE(libs.find("libtessel_flight_recorder"), std::string::npos) << libs;
  for (const char* forbidden :
       {"libtessel_tensor", "libtessel_collectives", "libtessel_mesh", "libtessel_kernels",
        "libgloo", "libmpi", "libnccl", "libcudart", "libcublas", "libdnnl"}) {
    EXPECT_EQ(libs.find(forbidden), std::string::npos) << "tessel-run loads " << forbidden << ":\n"
                                                       << libs;
  }
}

}  // namespace
