#pragma once
// What tessel-run takes from Slurm when `srun --ntasks-per-node 1 tessel-run ...` starts one
// agent per node: the step's node count and this node's index, the job id as the run id, the
// rendezvous endpoint on the step's first node, and workers per node from the allocation.
//
//   if (auto job = read_slurm_step(env)) {
//     nnodes = job->nnodes;  node_rank = job->node_rank;  rdzv_id = job->job_id;
//     endpoint = slurm_rdzv_endpoint(*job, env);   // "10.0.0.1:29412": node[0-7]'s first
//   }
//
// Pure functions of the environment passed in (tests sweep them), except resolving a node name
// (getaddrinfo, then `scontrol show node` when the name maps to a loopback address here).

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessel/launcher/options.h"

namespace tessel::launcher {

// Expands a Slurm hostlist expression into host names, in order:
//   "node[0-2,5],gpu01"   -> node0 node1 node2 node5 gpu01
//   "n[008-010]"          -> n008 n009 n010   (zero padding kept)
//   "r[1-2]-n[1-2]"       -> r1-n1 r1-n2 r2-n1 r2-n2
// Throws InvalidArgument naming the text (unbalanced brackets, a bad range, an empty name).
std::vector<std::string> expand_hostlist(const std::string& text);

// One srun step as tessel-run sees it.
struct SlurmStep {
  int nnodes = 1;          // SLURM_STEP_NUM_NODES (else SLURM_NNODES)
  int node_rank = 0;       // SLURM_NODEID: this node's index in the step
  std::string job_id;      // SLURM_JOB_ID
  std::string first_node;  // first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST)
};

// The step tessel-run runs in, or nullopt outside an srun step (no SLURM_STEP_ID, as in the
// batch script itself). Throws InvalidArgument naming a variable that is malformed.
std::optional<SlurmStep> read_slurm_step(const Environment& env);

// True inside a Slurm allocation's batch script (SLURM_NNODES set, no step): tessel-run started
// there runs on that node only.
bool in_slurm_batch_script(const Environment& env);

// The IPv4 address other nodes reach `node` at: getaddrinfo's, unless that is a loopback
// address (a stock Debian /etc/hosts maps the host's own name to 127.0.1.1), then
// `slurm_node_addr(node)` (by default the NodeAddr of `scontrol show node`). Throws
// InvalidArgument when neither gives an address.
std::string resolve_node_address(
    const std::string& node,
    const std::function<std::string(const std::string&)>& slurm_node_addr = nullptr);

// The rendezvous endpoint of a step: MASTER_ADDR (else the first node's address) and
// MASTER_PORT (else 29400 + the job id mod 1000, so jobs that share a node differ).
std::string slurm_rdzv_endpoint(
    const SlurmStep& step, const Environment& env,
    const std::function<std::string(const std::string&)>& slurm_node_addr = nullptr);

// Workers per node for --nproc-per-node auto/gpu/cpu from the allocation on this node: GPUs
// (SLURM_GPUS_ON_NODE, else the count of SLURM_STEP_GPUS / SLURM_JOB_GPUS) for gpu, and for
// auto when there are any; CPUs of this task (SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE)
// for cpu, and for auto without GPUs. nullopt when Slurm says nothing; InvalidArgument for gpu
// on an allocation without GPUs.
std::optional<int> slurm_nproc_per_node(const std::string& kind, const Environment& env);

}  // namespace tessel::launcher
