#include "tessel/flight_recorder/internal/pickle.h"

#include <cstring>
#include <unordered_map>
#include <vector>

#include "tessel/base/error.h"

namespace tessel::fr::internal {
namespace {

using Json = nlohmann::json;

// A stack machine over the opcodes PyTorch's pickler emits. MARK is kept as a separate stack
// of positions, the memo as a map, as the pickle format describes them.
class Unpickler {
 public:
  Unpickler(std::string_view data, const std::string& name) : d_(data), name_(name) {}

  Json run() {
    for (;;) {
      const size_t at = pos_;
      const uint8_t op = byte();
      switch (op) {
        case 0x80:
          byte();
          break;  // PROTO n
        case 0x95:
          take(8);
          break;     // FRAME: the length of the next frame
        case '.': {  // STOP
          if (stack_.size() != 1)
            fail(at, fmt::format("STOP with {} values on the stack", stack_.size()));
          return std::move(stack_.back());
        }
        case '}':
          stack_.push_back(Json::object());
          break;  // EMPTY_DICT
        case ']':
          stack_.push_back(Json::array());
          break;  // EMPTY_LIST
        case ')':
          stack_.push_back(Json::array());
          break;  // EMPTY_TUPLE
        case '(':
          marks_.push_back(stack_.size());
          break;  // MARK
        case 'N':
          stack_.push_back(nullptr);
          break;  // NONE
        case 0x88:
          stack_.push_back(true);
          break;  // NEWTRUE
        case 0x89:
          stack_.push_back(false);
          break;  // NEWFALSE
        case 'K':
          stack_.push_back(static_cast<int64_t>(byte()));
          break;  // BININT1
        case 'M':
          stack_.push_back(static_cast<int64_t>(le(2)));
          break;  // BININT2
        case 'J':
          stack_.push_back(static_cast<int64_t>(static_cast<int32_t>(le(4))));
          break;
        case 0x8a:
          stack_.push_back(long1(at));
          break;  // LONG1
        case 'G':
          stack_.push_back(binfloat());
          break;  // BINFLOAT
        case 'X':
          stack_.push_back(std::string(take(le(4))));
          break;  // BINUNICODE
        case 0x8c:
          stack_.push_back(std::string(take(byte())));
          break;  // SHORT_BINUNICODE
        case 0x8d:
          stack_.push_back(std::string(take(le(8))));
          break;  // BINUNICODE8
        case 'C':
          stack_.push_back(std::string(take(byte())));
          break;  // SHORT_BINBYTES
        case 'B':
          stack_.push_back(std::string(take(le(4))));
          break;  // BINBYTES
        case 'q':
          memo_[byte()] = top(at);
          break;  // BINPUT
        case 'r':
          memo_[le(4)] = top(at);
          break;  // LONG_BINPUT
        case 0x94:
          memo_[memo_.size()] = top(at);
          break;  // MEMOIZE
        case 'h':
          stack_.push_back(get(at, byte()));
          break;  // BINGET
        case 'j':
          stack_.push_back(get(at, le(4)));
          break;  // LONG_BINGET
        case 0x85:
          tuple(at, 1);
          break;  // TUPLE1
        case 0x86:
          tuple(at, 2);
          break;  // TUPLE2
        case 0x87:
          tuple(at, 3);
          break;  // TUPLE3
        case 't':
          stack_.push_back(Json(pop_mark(at)));
          break;  // TUPLE
        case 'l':
          stack_.push_back(Json(pop_mark(at)));
          break;     // LIST
        case 'a': {  // APPEND
          Json v = pop(at);
          list_at(at).push_back(std::move(v));
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Json> items = pop_mark(at);
          Json& list = list_at(at);
          for (auto& v : items) list.push_back(std::move(v));
          break;
        }
        case 's': {  // SETITEM
          Json v = pop(at), k = pop(at);
          set_item(at, std::move(k), std::move(v));
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Json> items = pop_mark(at);
          if (items.size() % 2 != 0) fail(at, "SETITEMS with an odd number of values");
          for (size_t i = 0; i < items.size(); i += 2) {
            set_item(at, std::move(items[i]), std::move(items[i + 1]));
          }
          break;
        }
        default:
          fail(at, fmt::format("opcode 0x{:02x} is not supported: tessel-trace reads the dicts, "
                               "lists, strings and numbers of PyTorch's flight-recorder dumps, "
                               "and never builds Python objects",
                               op));
      }
    }
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw InvalidArgument(fmt::format("{}: pickle byte {}: {}", name_, at, what));
  }
  uint8_t byte() {
    if (pos_ >= d_.size()) fail(pos_, "truncated (expected more bytes)");
    return static_cast<uint8_t>(d_[pos_++]);
  }
  std::string_view take(uint64_t n) {
    if (n > d_.size() - pos_) fail(pos_, fmt::format("truncated: {} bytes announced", n));
    const std::string_view v = d_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  uint64_t le(int bytes) {
    uint64_t v = 0;
    const std::string_view b = take(static_cast<uint64_t>(bytes));
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[i]);
    return v;
  }
  Json long1(size_t at) {
    const uint8_t n = byte();
    if (n > 8) fail(at, fmt::format("an integer of {} bytes does not fit 64 bits", n));
    if (n == 0) return int64_t{0};
    uint64_t v = le(n);
    if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }
  Json binfloat() {
    uint64_t bits = 0;
    for (uint8_t c : take(8)) bits = (bits << 8) | c;  // big-endian
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  const Json& top(size_t at) const {
    if (stack_.empty()) fail(at, "memo store with an empty stack");
    return stack_.back();
  }
  Json get(size_t at, uint64_t key) const {
    const auto it = memo_.find(key);
    if (it == memo_.end()) fail(at, fmt::format("memo key {} was never stored", key));
    return it->second;
  }
  Json pop(size_t at) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail(at, "stack underflow");
    }
    Json v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::vector<Json> pop_mark(size_t at) {
    if (marks_.empty()) fail(at, "no MARK to pop to");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Json> items(std::make_move_iterator(stack_.begin() + static_cast<long>(m)),
                            std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  void tuple(size_t at, int n) {
    std::vector<Json> items(static_cast<size_t>(n));
    for (int i = n - 1; i >= 0; --i) items[static_cast<size_t>(i)] = pop(at);
    stack_.push_back(Json(std::move(items)));
  }
  Json& list_at(size_t at) {
    if (stack_.empty() || !stack_.back().is_array()) fail(at, "APPEND to something not a list");
    return stack_.back();
  }
  void set_item(size_t at, Json key, Json value) {
    if (stack_.empty() || !stack_.back().is_object()) fail(at, "SETITEM on something not a dict");
    std::string k;
    if (key.is_string()) {
      k = key.get<std::string>();
    } else if (key.is_number_integer()) {
      k = std::to_string(key.get<int64_t>());
    } else {
      fail(at,
           fmt::format("a dict key of type {} (expected a string or an integer)", key.type_name()));
    }
    stack_.back()[k] = std::move(value);
  }

  std::string_view d_;
  const std::string& name_;
  size_t pos_ = 0;
  std::vector<Json> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Json> memo_;
};

}  // namespace

Json unpickle(std::string_view data, const std::string& name) {
  return Unpickler(data, name).run();
}

}  // namespace tessel::fr::internal
