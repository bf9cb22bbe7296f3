#include "grammar/vocabulary.h"

namespace kiln::grammar {

std::shared_ptr<const Vocabulary> vocabulary_from(const Tokenizer& tokenizer) {
  auto v = std::make_shared<Vocabulary>();
  const int32_t n = tokenizer.n_vocab();
  v->bytes.resize(static_cast<size_t>(n));
  v->excluded.assign(static_cast<size_t>(n), 0);
  for (int32_t id = 0; id < n; ++id) {
    const auto i = static_cast<size_t>(id);
    if (tokenizer.is_eog(id)) {
      v->end_ids.push_back(id);
      v->excluded[i] = 1;  // allowed only as an end token
      continue;
    }
    v->bytes[i] = tokenizer.token_to_piece(id);
    if (tokenizer.is_special(id) || v->bytes[i].empty()) v->excluded[i] = 1;
  }
  return v;
}

}  // namespace kiln::grammar
