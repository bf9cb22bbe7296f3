// What a waiting request is charged against --max-queued-tokens (server/api.h, queued_charge): its prompt
// tokens and a fixed share per choice, plus the fields every choice copies.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/api.h"

namespace kiln::server {
namespace {

TEST(QueuedCharge, PromptTokensAndAFixedSharePerChoice) {
  const Request base;
  EXPECT_EQ(queued_charge({std::vector<int32_t>(1, 7)}, 1, base), 1 + kQueuedChoiceTokens);
  // Two prompts sampled three times each: six choices, each holding its prompt's tokens.
  EXPECT_EQ(queued_charge({std::vector<int32_t>(10), std::vector<int32_t>(2000)}, 3, base),
            3 * (10 + kQueuedChoiceTokens) + 3 * (2000 + kQueuedChoiceTokens));
  // A one-word request holds under 10 KiB (bench/burst_memory.py): the fixed share keeps the bound in bytes
  // honest for tiny prompts.
  EXPECT_GE(kQueuedChoiceTokens * kQueuedTokenBytes, 10 * 1024);
}

TEST(QueuedCharge, LogitBiasStopStringsAndSaltAreChargedAsEveryChoiceCopiesThem) {
  Request base;
  for (int32_t t = 0; t < 49152; ++t) base.sampling.logit_bias.emplace_back(t, 1.0f);
  // 8 bytes an entry, held three times over (16 to 24 bytes measured): 1,179,648 bytes, 18,432 tokens.
  EXPECT_EQ(queued_charge({std::vector<int32_t>(2)}, 1, base), 2 + kQueuedChoiceTokens + 18432);
  EXPECT_EQ(queued_charge({std::vector<int32_t>(2)}, 2, base), 2 * (2 + kQueuedChoiceTokens + 18432));
  base.sampling.logit_bias.clear();
  base.sampling.stop = {std::string(1000, 'x'), "y"};
  base.cache_salt = std::string(23, 's');
  EXPECT_EQ(queued_charge({std::vector<int32_t>(5)}, 1, base),
            5 + kQueuedChoiceTokens + (3 * 1024 + 63) / 64);
}

}  // namespace
}  // namespace kiln::server
