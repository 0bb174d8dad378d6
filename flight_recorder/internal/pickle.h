#pragma once
// A reader for the subset of Python's pickle format that PyTorch's flight recorder writes
// (torch._C._distributed_c10d._dump_fr_trace, and the files under TORCH_FR_DUMP_TEMP_FILE):
// protocol 2 to 5 with dicts, lists, tuples, strings, bytes, integers, floats, booleans and
// None. Anything else (object construction, globals, persistent ids) is refused with an error
// naming the opcode and its byte offset: it never runs code, unlike Python's unpickler.
//
// Thread-safe: a pure function.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tessel::fr::internal {

// The pickled value as JSON (tuples become arrays, bytes become strings, dict keys must be
// strings or integers). Throws InvalidArgument naming `name`, the offset and the problem.
nlohmann::json unpickle(std::string_view data, const std::string& name);

}  // namespace tessel::fr::internal
