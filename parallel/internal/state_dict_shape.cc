#include "tessel/parallel/internal/state_dict_shape.h"

namespace tessel::internal {

Shape state_dict_shape(nn::Module& model, const std::string& dotted_name, const Shape& shape) {
  const size_t dot = dotted_name.rfind('.');
  nn::Module& owner =
      dot == std::string::npos ? model : model.submodule(dotted_name.substr(0, dot));
  const auto recorded =
      std::static_pointer_cast<StateDictShapes>(owner.attachment(kStateDictShapes));
  if (!recorded) return shape;
  const std::string leaf = dot == std::string::npos ? dotted_name : dotted_name.substr(dot + 1);
  const auto it = recorded->shapes.find(leaf);
  return it == recorded->shapes.end() ? shape : it->second;
}

}  // namespace tessel::internal
