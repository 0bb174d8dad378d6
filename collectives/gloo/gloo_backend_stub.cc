// Built when Gloo was not found: the backend reports itself unavailable.
#include "tessel/base/error.h"
#include "tessel/collectives/gloo/gloo_backend.h"

namespace tessel {

bool gloo::is_available() { return false; }

std::shared_ptr<ProcessGroup> gloo::create_process_group(std::shared_ptr<Store>, int, int,
                                                         GlooOptions) {
  throw Unavailable(
      "this tessel build has no Gloo backend (configure with TESSEL_WITH_GLOO=ON "
      "after installing libgloo-dev)");
}

}  // namespace tessel
