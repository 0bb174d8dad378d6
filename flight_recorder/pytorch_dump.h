#pragma once
// PyTorch's flight-recorder dumps, read into tessel's RankDump so the same analyzer judges them:
// the JSON of torch._C._distributed_c10d._dump_fr_trace_json() and the pickle of
// _dump_fr_trace() / the files written to TORCH_FR_DUMP_TEMP_FILE<rank> (pickle parsed here, in
// C++, for the plain subset PyTorch writes; anything else is refused with a clear message).
//
// What maps to what: the rank is the number that ends the file name (as torchfrtrace reads
// it); the group is the name all its members give it (process_group[0]: "n" becomes group
// n + 1, other names a hash; pg_id only counts the groups one process built), named by its
// description (or "pg<name>"); collective_seq_id is the seq; profiling_name "gloo:all_reduce" /
// "nccl:all_reduce" the op, and "nccl:send 0->1" / "nccl:recv 1<-0" also the peer (a send's or
// recv's seq is then its count per peer and direction, else p2p_seq_id);
// input_sizes/dtypes the arguments (several tensors add up); time_created_ns (wall clock) the
// enqueue time; an entry is finished once retired or completed. Members of a group come from
// pg_config when it names the group; PyTorch's Gloo recorder (2.15) writes one pg_config entry
// keyed "" per rank, which is taken as the members of the one non-default group it can be;
// otherwise a group's members are the ranks that recorded entries in it. Gloo records no
// send/recv; a send/recv without a peer in its name stays unexplained. read_dump_dir then reads
// back entries that timed out (retired like finished ones): internal/pytorch_timeouts.h.
//
// Thread-safe: pure functions.

#include <string>
#include <string_view>

#include "tessel/flight_recorder/reader.h"

namespace tessel::fr {

enum class ForeignFormat { kNone, kPytorchJson, kPytorchPickle };

// Which PyTorch dump `bytes` holds, by content (kNone for anything else).
ForeignFormat sniff_pytorch_dump(std::string_view bytes);

// The rank a PyTorch dump's file name ends with ("rank_3", "trace_3.json" -> 3); -1 when none.
int rank_from_dump_name(const std::string& file_name);

// Parses one PyTorch dump of `rank` (world size unknown: -1 until read_dump_dir settles it).
// Throws InvalidArgument naming `name` and the field for anything malformed or unsupported.
RankDump parse_pytorch_dump(std::string_view bytes, int rank, const std::string& name);

// Fills in what one dump cannot know: the world size and the members of groups that only the
// other ranks' dumps reveal. Called by read_dump_dir on a set of PyTorch dumps.
void settle_pytorch_groups(std::vector<RankDump>& dumps, int world_size_hint);

}  // namespace tessel::fr
