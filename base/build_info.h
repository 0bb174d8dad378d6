#pragma once
// What this build of tessel contains: version, build type, and which optional backends were
// compiled in. Run-time availability (a GPU present, mpirun used) is asked of each backend.

#include <string>
#include <string_view>

namespace tessel {

struct BuildInfo {
  std::string_view version;     // "0.1.0"
  std::string_view build_type;  // "Release"
  std::string_view compiler;    // "GNU 12.2.0"
  bool with_cuda;
  bool with_nccl;
  bool with_cudnn;
  bool with_mpi;
  bool with_grpc;
  bool with_gloo;
  std::string_view cuda_version;        // "" without CUDA
  std::string_view cuda_architectures;  // "80;90a"
};

const BuildInfo& build_info();

// Multi-line human-readable summary, as printed by `tessel-info`.
std::string build_info_text();

}  // namespace tessel
