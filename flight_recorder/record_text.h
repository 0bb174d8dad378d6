#pragma once
// Text the flight recorder puts on the operations the calling thread records while a scope
// lives, when the operation carries none of its own: what the operation is for in the caller's
// terms. The pipeline runtime names each send and receive by its action, so a hang's verdict
// reads "recv #2 at rank 1 from rank 0 in group 'world/pp_act0>1' (pipeline RECV_F1s1<0: mb 1,
// stage 1)".
//
//   {
//     tessel::fr::ScopedRecordText text("pipeline SEND_F3s1>2: mb 3, stage 1");
//     channel->send(activation, 1, {.async = true});   // recorded with that text
//   }
//
// The text is copied into each entry's fixed text field (47 bytes kept); no allocation. Scopes
// nest (the innermost wins; the previous text is back at destruction). Create and destroy on
// one thread; not copyable. Operations that carry text (user events, spans, splits) keep theirs.

#include <string_view>

namespace tessel::fr {

inline constexpr size_t kMaxRecordText = 48;  // bytes of an entry's text, NUL included

class ScopedRecordText {
 public:
  explicit ScopedRecordText(std::string_view text) noexcept;
  ~ScopedRecordText();
  ScopedRecordText(const ScopedRecordText&) = delete;
  ScopedRecordText& operator=(const ScopedRecordText&) = delete;

 private:
  char previous_[kMaxRecordText];
};

// The calling thread's innermost ScopedRecordText's text, "" outside any.
std::string_view record_text() noexcept;

}  // namespace tessel::fr
