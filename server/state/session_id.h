// The one grammar of session ids, so an id is always safe as a directory name:
//   id    = [ label "." ] hex32
//   label = [a-z0-9] ( [a-z0-9-]{0,61} [a-z0-9] )?      (a DNS label, 1..63 chars)
//   hex32 = 32 lowercase hex digits                      (128 random bits)
// The optional label names the owning replica ("echokv-2.0123...ef").
//
//   if (!state::IsValidSessionId(id)) return absl::InvalidArgumentError("bad session id");
//   ECHOKV_RETURN_IF_ERROR(state::ValidateSessionId(id));   // same, with a message
#ifndef ECHOKV_SERVER_STATE_SESSION_ID_H_
#define ECHOKV_SERVER_STATE_SESSION_ID_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace echokv::state {

inline constexpr size_t kMaxSessionIdLength = 63 + 1 + 32;

bool IsValidSessionId(absl::string_view id);

// OK, or INVALID_ARGUMENT saying which part of the grammar `id` breaks (the id is quoted
// only up to 100 bytes, with non-printable bytes escaped).
absl::Status ValidateSessionId(absl::string_view id);

}  // namespace echokv::state

#endif  // ECHOKV_SERVER_STATE_SESSION_ID_H_
