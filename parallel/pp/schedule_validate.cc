// validate_schedule: sizes, completeness, local data flow, per-peer order, a deadlock run.
#include "tessel/parallel/pp/schedule_validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "tessel/base/error.h"

namespace tessel::pp {
namespace {

constexpr int kNone = -1;

// Positions (index into the rank's list) of each kind of action, per (micro-batch, stage).
class PositionTable {
 public:
  PositionTable(int m, int S)
      : S_(std::max(S, 0)), pos_(static_cast<size_t>(std::max(m, 0)) * S_, kNone) {}
  int& at(int mb, int stage) { return pos_[static_cast<size_t>(mb) * S_ + stage]; }

 private:
  int S_;
  std::vector<int> pos_;
};

class Validator {
 public:
  explicit Validator(const PipelineSchedule& s)
      : s_(s),
        p_(s.num_ranks),
        S_(s.num_stages),
        m_(s.num_microbatches),
        f_(0, 0),
        b_(0, 0),
        w_(0, 0),
        bw_(0, 0),
        send_f_(0, 0),
        recv_f_(0, 0),
        send_b_(0, 0),
        recv_b_(0, 0) {}

  ScheduleCheck run() {
    check_sizes_and_fill();
    check_complete();
    check_data_flow();
    check_peer_order();
    check_no_deadlock();
    return {peak_in_flight()};
  }

 private:
  [[noreturn]] void fail(int rank, int index, const std::string& why) const {
    throw InvalidArgument(fmt::format("pipeline schedule '{}': rank {}, action {} '{}': {}",
                                      s_.name, rank, index + 1, to_string(s_.ranks[rank][index]),
                                      why));
  }
  [[noreturn]] void fail_rank(int rank, const std::string& why) const {
    throw InvalidArgument(fmt::format("pipeline schedule '{}': rank {}: {}", s_.name, rank, why));
  }

  PositionTable& table(ActionKind kind) {
    switch (kind) {
      case ActionKind::kForward:
        return f_;
      case ActionKind::kBackwardInput:
        return b_;
      case ActionKind::kBackwardWeight:
        return w_;
      case ActionKind::kBackward:
        return bw_;
      case ActionKind::kSendActivation:
        return send_f_;
      case ActionKind::kRecvActivation:
        return recv_f_;
      case ActionKind::kSendGradient:
        return send_b_;
      case ActionKind::kRecvGradient:
        return recv_b_;
      case ActionKind::kStep:
        break;
    }
    throw Internal("pipeline schedule: STEP has no position table");
  }

  // The rank a send/receive must name as its peer; kNone if the stage has no such neighbour.
  int expected_peer(const Action& a) const {
    int other = kNone;
    if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGradient) {
      other = a.stage + 1;
    } else {
      other = a.stage - 1;
    }
    return other >= 0 && other < S_ ? s_.stage_rank(other) : kNone;
  }

  // 1. Sizes, ranges, placement and peers; then records every action's position.
  void check_sizes_and_fill() {
    if (p_ < 1 || m_ < 1 || S_ < 1 || S_ % p_ != 0 || static_cast<int>(s_.ranks.size()) != p_) {
      throw InvalidArgument(fmt::format(
          "pipeline schedule '{}': ranks={} stages={} microbatches={} with {} rank lists; "
          "expected p >= 1, m >= 1, stages a positive multiple of p and one list per rank",
          s_.name, p_, S_, m_, s_.ranks.size()));
    }
    for (int r = 0; r < p_; ++r) {
      int step_at = kNone;
      for (int i = 0; i < static_cast<int>(s_.ranks[r].size()); ++i) {
        const Action& a = s_.ranks[r][i];
        if (a.kind == ActionKind::kStep) {
          if (step_at != kNone)
            fail(r, i, fmt::format("a second STEP (the first is action {})", step_at + 1));
          step_at = i;
          continue;
        }
        if (step_at != kNone) {
          fail(r, i,
               fmt::format("comes after STEP (action {}); the optimizer step must follow "
                           "all of the rank's work",
                           step_at + 1));
        }
        if (a.microbatch < 0 || a.microbatch >= m_) {
          fail(r, i,
               fmt::format("micro-batch {} is out of range; expected 0..{}", a.microbatch, m_ - 1));
        }
        if (a.stage < 0 || a.stage >= S_) {
          fail(r, i, fmt::format("stage {} is out of range; expected 0..{}", a.stage, S_ - 1));
        }
        if (s_.stage_rank(a.stage) != r) {
          fail(r, i,
               fmt::format("stage {} runs on rank {} (stage % {}), not on rank {}", a.stage,
                           s_.stage_rank(a.stage), p_, r));
        }
        if (is_send(a.kind) || is_recv(a.kind)) {
          const int peer = expected_peer(a);
          if (peer == kNone) {
            fail(r, i,
                 fmt::format("stage {} has no {} stage to {}", a.stage,
                             expected_peer_is_next(a) ? "next" : "previous",
                             is_send(a.kind) ? "send to" : "receive from"));
          }
          if (peer == r) {
            fail(r, i,
                 fmt::format("the neighbouring stage is on this rank; the tensor stays "
                             "local and needs no {}",
                             is_send(a.kind) ? "send" : "receive"));
          }
          if (a.peer != peer) {
            fail(r, i,
                 fmt::format("peer rank {}; the neighbouring stage runs on rank {}", a.peer, peer));
          }
        }
      }
    }
    // Each (micro-batch, stage) needs an F and a backward: refuse sizes the lists cannot fill
    // before sizing the tables by them.
    int64_t actions = 0;
    for (const auto& list : s_.ranks) actions += static_cast<int64_t>(list.size());
    if (2 * static_cast<int64_t>(m_) * S_ > actions) {
      throw InvalidArgument(fmt::format(
          "pipeline schedule '{}': {} micro-batches on {} stages need at least {} actions (an F "
          "and a backward each); the ranks' lists have {}",
          s_.name, m_, S_, 2 * static_cast<int64_t>(m_) * S_, actions));
    }
    for (PositionTable* t : {&f_, &b_, &w_, &bw_, &send_f_, &recv_f_, &send_b_, &recv_b_}) {
      *t = PositionTable(m_, S_);
    }
    for (int r = 0; r < p_; ++r) {
      for (int i = 0; i < static_cast<int>(s_.ranks[r].size()); ++i) {
        const Action& a = s_.ranks[r][i];
        if (a.kind == ActionKind::kStep) continue;
        int& pos = table(a.kind).at(a.microbatch, a.stage);
        if (pos != kNone) fail(r, i, fmt::format("appears twice (also action {})", pos + 1));
        pos = i;
      }
    }
  }

  static bool expected_peer_is_next(const Action& a) {
    return a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGradient;
  }

  // 2. Every micro-batch's work on every stage, and every cross-rank transfer, exactly once.
  void check_complete() {
    for (int mb = 0; mb < m_; ++mb) {
      for (int st = 0; st < S_; ++st) {
        const int r = s_.stage_rank(st);
        if (f_.at(mb, st) == kNone) fail_rank(r, fmt::format("F{}s{} is missing", mb, st));
        const bool split = b_.at(mb, st) != kNone || w_.at(mb, st) != kNone;
        if (bw_.at(mb, st) != kNone && split) {
          fail(r, bw_.at(mb, st),
               fmt::format("micro-batch {} of stage {} also has a split "
                           "backward (B/W); expected BW or B and W",
                           mb, st));
        }
        if (!split && bw_.at(mb, st) == kNone) {
          fail_rank(r, fmt::format("the backward of micro-batch {} on stage {} is missing "
                                   "(BW{}s{}, or B{}s{} and W{}s{})",
                                   mb, st, mb, st, mb, st, mb, st));
        }
        if (split && b_.at(mb, st) == kNone) {
          fail(r, w_.at(mb, st), fmt::format("B{}s{} is missing", mb, st));
        }
        if (split && w_.at(mb, st) == kNone) {
          fail(r, b_.at(mb, st), fmt::format("W{}s{} is missing", mb, st));
        }
        if (st + 1 < S_ && s_.stage_rank(st + 1) != r) {
          const int q = s_.stage_rank(st + 1);
          check_pair(r, send_f_.at(mb, st), fmt::format("SEND_F{}s{}>{}", mb, st, q), q,
                     recv_f_.at(mb, st + 1), fmt::format("RECV_F{}s{}<{}", mb, st + 1, r));
          check_pair(q, send_b_.at(mb, st + 1), fmt::format("SEND_B{}s{}>{}", mb, st + 1, r), r,
                     recv_b_.at(mb, st), fmt::format("RECV_B{}s{}<{}", mb, st, q));
        }
      }
    }
  }

  void check_pair(int sender, int send_pos, const std::string& send_token, int receiver,
                  int recv_pos, const std::string& recv_token) {
    if (send_pos == kNone && recv_pos == kNone) {
      fail_rank(sender, fmt::format("{} is missing, and its receive {} on rank {}", send_token,
                                    recv_token, receiver));
    }
    if (recv_pos == kNone) {
      fail(sender, send_pos,
           fmt::format("rank {} never receives it (no {})", receiver, recv_token));
    }
    if (send_pos == kNone) {
      fail(receiver, recv_pos, fmt::format("rank {} never sends it (no {})", sender, send_token));
    }
  }

  int backward_of(int mb, int st) {
    return bw_.at(mb, st) != kNone ? bw_.at(mb, st) : b_.at(mb, st);
  }

  // 3. On each rank, every action after what it consumes.
  void check_data_flow() {
    for (int r = 0; r < p_; ++r) {
      for (int i = 0; i < static_cast<int>(s_.ranks[r].size()); ++i) {
        const Action& a = s_.ranks[r][i];
        const int mb = a.microbatch;
        const int st = a.stage;
        auto need = [&](int pos, const std::string& what) {
          if (pos > i) fail(r, i, fmt::format("runs before {} (action {})", what, pos + 1));
        };
        switch (a.kind) {
          case ActionKind::kForward:
            if (st > 0 && s_.stage_rank(st - 1) == r) {
              need(f_.at(mb, st - 1), fmt::format("F{}s{}, whose output it consumes", mb, st - 1));
            } else if (st > 0) {
              need(recv_f_.at(mb, st), "the receive of its input activation");
            }
            break;
          case ActionKind::kBackward:
          case ActionKind::kBackwardInput:
            need(f_.at(mb, st), fmt::format("its forward F{}s{}", mb, st));
            if (st + 1 < S_ && s_.stage_rank(st + 1) == r) {
              need(backward_of(mb, st + 1),
                   fmt::format("the backward of stage {}, whose input gradient it consumes",
                               st + 1));
            } else if (st + 1 < S_) {
              need(recv_b_.at(mb, st), "the receive of its output gradient");
            }
            break;
          case ActionKind::kBackwardWeight:
            need(b_.at(mb, st), fmt::format("its backward-input B{}s{}", mb, st));
            break;
          case ActionKind::kSendActivation:
            need(f_.at(mb, st), fmt::format("F{}s{}, which produces the activation", mb, st));
            break;
          case ActionKind::kSendGradient:
            need(backward_of(mb, st), "the backward that produces the gradient");
            break;
          default:
            break;
        }
      }
    }
  }

  // The receive token that matches a send.
  static Action matching_recv(const Action& send, int sender) {
    if (send.kind == ActionKind::kSendActivation) {
      return {ActionKind::kRecvActivation, send.microbatch, send.stage + 1, sender};
    }
    return {ActionKind::kRecvGradient, send.microbatch, send.stage - 1, sender};
  }

  // 4. Per ordered pair of ranks, receives in the order of the sends.
  void check_peer_order() {
    for (int a = 0; a < p_; ++a) {
      for (int b = 0; b < p_; ++b) {
        if (a == b) continue;
        std::vector<Action> sends;
        for (const Action& x : s_.ranks[a]) {
          if (is_send(x.kind) && x.peer == b) sends.push_back(x);
        }
        size_t k = 0;
        for (int i = 0; i < static_cast<int>(s_.ranks[b].size()); ++i) {
          const Action& x = s_.ranks[b][i];
          if (!is_recv(x.kind) || x.peer != a) continue;
          if (k < sends.size() && !(matching_recv(sends[k], a) == x)) {
            fail(b, i,
                 fmt::format("is receive #{} from rank {}, but rank {}'s send #{} to rank "
                             "{} is {}; receives from a peer must come in the order it "
                             "sends",
                             k + 1, a, a, k + 1, b, to_string(sends[k])));
          }
          ++k;
        }
      }
    }
  }

  // 5. Runs the lists: sends post and continue, receives block until the peer's send is posted.
  void check_no_deadlock() {
    std::vector<size_t> pc(p_, 0);
    std::vector<int> sent(static_cast<size_t>(p_) * p_, 0);      // sent[a*p+b]
    std::vector<int> received(static_cast<size_t>(p_) * p_, 0);  // received[a*p+b], b from a
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < p_; ++r) {
        const auto& list = s_.ranks[r];
        while (pc[r] < list.size()) {
          const Action& x = list[pc[r]];
          if (is_recv(x.kind)) {
            const size_t ch = static_cast<size_t>(x.peer) * p_ + r;
            if (received[ch] == sent[ch]) break;
            ++received[ch];
          } else if (is_send(x.kind)) {
            ++sent[static_cast<size_t>(r) * p_ + x.peer];
          }
          ++pc[r];
          progress = true;
        }
      }
    }
    std::string blocked;
    for (int r = 0; r < p_; ++r) {
      if (pc[r] == s_.ranks[r].size()) continue;
      const Action& x = s_.ranks[r][pc[r]];
      const int q = x.peer;
      const std::string peer_state =
          pc[q] == s_.ranks[q].size()
              ? "has finished"
              : fmt::format("waits at action {} '{}'", pc[q] + 1, to_string(s_.ranks[q][pc[q]]));
      blocked +=
          fmt::format("{}rank {} waits at action {} '{}' for rank {}, which {}",
                      blocked.empty() ? "" : "; ", r, pc[r] + 1, to_string(x), q, peer_state);
    }
    if (!blocked.empty()) {
      throw InvalidArgument(fmt::format(
          "pipeline schedule '{}': deadlock (sends asynchronous, receives blocking): {}", s_.name,
          blocked));
    }
  }

  std::vector<int> peak_in_flight() const {
    std::vector<int> peak(p_, 0);
    for (int r = 0; r < p_; ++r) {
      int live = 0;
      for (const Action& a : s_.ranks[r]) {
        if (a.kind == ActionKind::kForward) ++live;
        if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --live;
        peak[r] = std::max(peak[r], live);
      }
    }
    return peak;
  }

  const PipelineSchedule& s_;
  int p_, S_, m_;
  PositionTable f_, b_, w_, bw_, send_f_, recv_f_, send_b_, recv_b_;
};

}  // namespace

ScheduleCheck validate_schedule(const PipelineSchedule& schedule) {
  return Validator(schedule).run();
}

}  // namespace tessel::pp
