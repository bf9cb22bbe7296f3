#include "models/moe.h"
namespace kiln::blocks {
Result<MoeWeights> load_moe(WeightLoader&, const std::string&, int64_t, const MoeShape&, bool) {
  return unimplemented("mixture-of-experts layers are not supported yet");
}
Result<Tensor> moe_ffn(Backend&, Arena&, const Tensor&, const MoeWeights&, const MoeShape&, bool) {
  return unimplemented("mixture-of-experts layers are not supported yet");
}
}  // namespace kiln::blocks
