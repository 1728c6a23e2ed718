// A whole conversation sent to continue a session (InputSpec::whole_conversation): what
// it adds after the session's stored messages. Pure; the engine calls it under the
// session's claim, so no other append can come between the check and the append.
//
//   stored: [system, user "hi", assistant "hello"]
//   sent:   [system, user "hi", assistant "hello", user "and now?"]
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<model::ChatMessage> added, NewMessages(stored, sent));
//   // added == [user "and now?"]
#ifndef ECHOKV_SERVER_ENGINE_CONVERSATION_H_
#define ECHOKV_SERVER_ENGINE_CONVERSATION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "model/chat_template.h"

namespace echokv::server {

// The messages of `sent` after `stored`, which must be its beginning (role and content
// equal, message by message). Errors (common/errors.h):
//   kConversationMismatch, field "input.chat[i]": message i is the first that differs
//     from the stored one;
//   kConversationMismatch, field "input.chat": `sent` ends before `stored` does (and
//     agrees with it up to there);
//   kInvalidArgument, field "input.chat": nothing after `stored`, which ends with the
//     assistant's reply (there is nothing to answer).
// Nothing after a `stored` that does not end with the assistant's reply is an empty
// list (e.g. a session created with the question and the generation prompt).
absl::StatusOr<std::vector<model::ChatMessage>> NewMessages(const std::vector<model::ChatMessage>& stored,
                                                            const std::vector<model::ChatMessage>& sent);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_CONVERSATION_H_
