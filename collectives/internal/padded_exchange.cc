#include "tessel/collectives/internal/padded_exchange.h"

#include <algorithm>

#include "tessel/base/error.h"

namespace tessel::internal {

bool counts_even(std::span<const int64_t> counts) {
  return std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
}

PaddedExchange plan_padded_exchange(std::span<const int64_t> counts) {
  TESSEL_CHECK(!counts.empty(), InvalidArgument, "padded exchange: no counts given");
  PaddedExchange plan;
  plan.offsets.reserve(counts.size());
  int64_t offset = 0;
  for (int64_t c : counts) {
    TESSEL_CHECK(c >= 0, InvalidArgument, "padded exchange: count {} is negative", c);
    plan.offsets.push_back(offset);
    offset += c;
    plan.part = std::max(plan.part, c);
  }
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] == 0) continue;
    const ElementCopy copy{plan.offsets[r], static_cast<int64_t>(r) * plan.part, counts[r]};
    // A part that follows a full one without a gap continues its copy in both layouts.
    if (!plan.pack.empty()) {
      ElementCopy& last = plan.pack.back();
      if (last.from + last.count == copy.from && last.to + last.count == copy.to) {
        last.count += copy.count;
        continue;
      }
    }
    plan.pack.push_back(copy);
  }
  plan.unpack.reserve(plan.pack.size());
  for (const ElementCopy& c : plan.pack) plan.unpack.push_back({c.to, c.from, c.count});
  return plan;
}

}  // namespace tessel::internal
