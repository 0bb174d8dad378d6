#pragma once
// PyTorch's dumps of ranks that dumped after their operation timed out. PyTorch's recorder
// retires a work item when its backend is done with it, with or without an error (Gloo's worker
// retires it after the timeout fires; NCCL's watchdog once the work holds its exception), so a
// timed-out operation reads exactly like a finished one. Membership and sequence numbers tell
// them apart: a collective cannot have completed while a member never issued it, nor a send
// whose receive the peer never posted (nor the reverse).
//
// Thread-safe: a pure function over its argument.

#include <cstddef>
#include <vector>

#include "tessel/flight_recorder/reader.h"

namespace tessel::fr::internal {

// Over a set of PyTorch dumps whose groups are settled (settle_pytorch_groups), reads back as
// still waiting (started, no completion time) every entry recorded finished that could not have
// finished:
//  - a collective (group G, seq s) while a member of G with a dump issued no seq as high as s in
//    G. That member's newest seq counts when its dump holds an entry of G or its whole history
//    (its oldest entry is PyTorch's record 0): a ring that overwrote the member's entries of G
//    proves nothing. Members without a dump prove nothing either (the analyzer names them).
//  - a send (recv) numbered k between two ranks while the peer posted fewer than k receives
//    (sends) from this rank; counted only where both dumps hold their whole history, as the
//    number is the rank's own count of its sends to (receives from) that peer.
// Entries every member issued stay as recorded, and so do later entries of the same rank: only
// what membership disproves changes. A dump's "now" (its newest stamp) is recomputed without the
// times of the entries read back. Returns how many entries were read back.
//
// The rule assumes what PyTorch's dumps carry no time to check: every rank dumped while the job
// hung, not one of them earlier while it still ran.
size_t reconcile_pytorch_timeouts(std::vector<RankDump>& dumps);

}  // namespace tessel::fr::internal
