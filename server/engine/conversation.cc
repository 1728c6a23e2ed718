#include "server/engine/conversation.h"

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "common/errors.h"

namespace echokv::server {

absl::StatusOr<std::vector<model::ChatMessage>> NewMessages(const std::vector<model::ChatMessage>& stored,
                                                            const std::vector<model::ChatMessage>& sent) {
  // Message by message, so the first difference is named even in a shorter conversation.
  for (size_t i = 0; i < stored.size(); ++i) {
    if (i >= sent.size()) {
      return MakeError(ErrorKind::kConversationMismatch, "input.chat",
                       absl::StrCat("input.chat: the session holds a conversation of ", stored.size(),
                                    " messages; the request sends ", sent.size(),
                                    ". Send the whole conversation (the session's messages, then the new ones)"));
    }
    if (stored[i].role != sent[i].role || stored[i].content != sent[i].content) {
      return MakeError(ErrorKind::kConversationMismatch, absl::StrCat("input.chat[", i, "]"),
                       absl::StrCat("input.chat[", i, "] (", sent[i].role, ") differs from message ", i,
                                    " of the session's conversation (", stored[i].role,
                                    "); a session's conversation cannot be edited: send it unchanged, then the "
                                    "new messages, or start a new session"));
    }
  }
  if (sent.size() == stored.size() && !stored.empty() && stored.back().role == "assistant") {
    return MakeError(ErrorKind::kInvalidArgument, "input.chat",
                     "input.chat: nothing new after the session's conversation, which ends with the assistant's "
                     "reply; add a user message");
  }
  return std::vector<model::ChatMessage>(sent.begin() + static_cast<std::ptrdiff_t>(stored.size()), sent.end());
}

}  // namespace echokv::server
