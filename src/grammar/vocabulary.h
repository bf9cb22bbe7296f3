// The matcher's view of a tokenizer's vocabulary (grammar.h: Vocabulary), made once per model.
#pragma once

#include <memory>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace kiln::grammar {

// Each token's bytes as detokenizing it appends them; the end-of-generation tokens as end_ids; every other
// control token, and every token with no bytes, excluded.
std::shared_ptr<const Vocabulary> vocabulary_from(const Tokenizer& tokenizer);

}  // namespace kiln::grammar
