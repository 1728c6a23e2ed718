// NewMessages (server/engine/conversation.h): what a whole conversation adds after a
// session's stored one, and the typed errors when it does not continue it.
#include "server/engine/conversation.h"

#include <gtest/gtest.h>

#include "common/errors.h"

namespace echokv::server {
namespace {

model::ChatMessage M(const char* role, const char* content) { return model::ChatMessage{role, content}; }

TEST(NewMessagesTest, KeepsWhatFollowsTheStoredConversation) {
  const std::vector<model::ChatMessage> stored = {M("system", "be brief"), M("user", "hi"), M("assistant", "hello")};
  std::vector<model::ChatMessage> sent = stored;
  sent.push_back(M("user", "and now?"));
  absl::StatusOr<std::vector<model::ChatMessage>> added = NewMessages(stored, sent);
  ASSERT_TRUE(added.ok()) << added.status();
  ASSERT_EQ(added->size(), 1u);
  EXPECT_EQ((*added)[0].content, "and now?");
  // A session without a conversation: everything is new.
  added = NewMessages({}, sent);
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(added->size(), 4u);
}

TEST(NewMessagesTest, NothingNewIsEmptyUnlessTheAssistantSpokeLast) {
  const std::vector<model::ChatMessage> asked = {M("user", "hi")};
  absl::StatusOr<std::vector<model::ChatMessage>> added = NewMessages(asked, asked);
  ASSERT_TRUE(added.ok());
  EXPECT_TRUE(added->empty());  // the question is there: generate its answer
  const std::vector<model::ChatMessage> answered = {M("user", "hi"), M("assistant", "hello")};
  added = NewMessages(answered, answered);
  EXPECT_EQ(ErrorInfoOf(added.status()).kind, ErrorKind::kInvalidArgument);
  EXPECT_EQ(ErrorInfoOf(added.status()).field, "input.chat");
}

TEST(NewMessagesTest, AConversationThatDiffersNamesTheFirstMessageThatDiffers) {
  const std::vector<model::ChatMessage> stored = {M("user", "hi"), M("assistant", "hello"), M("user", "more")};
  std::vector<model::ChatMessage> sent = stored;
  sent[1].content = "HELLO";
  sent[2].role = "system";
  absl::StatusOr<std::vector<model::ChatMessage>> added = NewMessages(stored, sent);
  EXPECT_EQ(ErrorInfoOf(added.status()).kind, ErrorKind::kConversationMismatch);
  EXPECT_EQ(ErrorInfoOf(added.status()).field, "input.chat[1]");
  EXPECT_EQ(added.status().code(), absl::StatusCode::kFailedPrecondition);
  sent = stored;
  sent[2].role = "system";
  EXPECT_EQ(ErrorInfoOf(NewMessages(stored, sent).status()).field, "input.chat[2]");
  // Shorter and different: the difference is named first.
  sent = {M("user", "hi"), M("assistant", "other")};
  EXPECT_EQ(ErrorInfoOf(NewMessages(stored, sent).status()).field, "input.chat[1]");
  // Shorter, agreeing as far as it goes: the whole input is at fault.
  sent = {M("user", "hi")};
  added = NewMessages(stored, sent);
  EXPECT_EQ(ErrorInfoOf(added.status()).kind, ErrorKind::kConversationMismatch);
  EXPECT_EQ(ErrorInfoOf(added.status()).field, "input.chat");
}

}  // namespace
}  // namespace echokv::server
