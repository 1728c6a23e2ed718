#include "server/state/fingerprint.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace echokv::state {
namespace {

constexpr absl::string_view kDomain = "echokv-model-fingerprint-v1";

XXH3_state_t* S(void* p) { return static_cast<XXH3_state_t*>(p); }

void U64(void* state, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>((v >> (8 * i)) & 0xff);
  XXH3_128bits_update(S(state), b, 8);
}

void Bytes(void* state, absl::string_view bytes) {
  U64(state, bytes.size());
  XXH3_128bits_update(S(state), bytes.data(), bytes.size());
}

}  // namespace

FingerprintBuilder::FingerprintBuilder() : state_(XXH3_createState()) {
  XXH3_128bits_reset(S(state_));
  XXH3_128bits_update(S(state_), kDomain.data(), kDomain.size());
}

FingerprintBuilder::~FingerprintBuilder() { XXH3_freeState(S(state_)); }

absl::Status FingerprintBuilder::AddConfig(absl::string_view config_json) {
  if (finished_ || has_config_ || has_tensor_) {
    failed_ = true;
    return absl::FailedPreconditionError(
        "fingerprint: AddConfig must be called exactly once, before any tensor");
  }
  has_config_ = true;
  Bytes(state_, config_json);
  return absl::OkStatus();
}

absl::Status FingerprintBuilder::AddTensor(absl::string_view name, absl::string_view dtype,
                                           absl::Span<const int64_t> shape,
                                           absl::string_view data) {
  if (finished_ || !has_config_) {
    failed_ = true;
    return absl::FailedPreconditionError("fingerprint: AddTensor before AddConfig or after Finish");
  }
  if (has_tensor_ && !(last_name_ < name)) {
    failed_ = true;
    return absl::InvalidArgumentError(absl::StrCat("fingerprint: tensor \"", name,
                                                   "\" is not after \"", last_name_,
                                                   "\" (names must be strictly increasing)"));
  }
  last_name_ = std::string(name);
  has_tensor_ = true;
  Bytes(state_, name);
  Bytes(state_, dtype);
  U64(state_, shape.size());
  for (int64_t d : shape) U64(state_, static_cast<uint64_t>(d));
  Bytes(state_, data);
  return absl::OkStatus();
}

absl::StatusOr<ModelFingerprint> FingerprintBuilder::Finish() {
  if (failed_ || !has_config_ || finished_) {
    return absl::FailedPreconditionError(
        "fingerprint: Finish needs a config, no earlier error and no earlier Finish");
  }
  finished_ = true;
  XXH128_hash_t h = XXH3_128bits_digest(S(state_));
  return ModelFingerprint{h.low64, h.high64};
}

absl::StatusOr<ModelFingerprint> ComputeModelFingerprint(absl::string_view config_json,
                                                         std::vector<TensorDigestInput> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorDigestInput& a, const TensorDigestInput& b) { return a.name < b.name; });
  FingerprintBuilder builder;
  ECHOKV_RETURN_IF_ERROR(builder.AddConfig(config_json));
  for (const TensorDigestInput& t : tensors) {
    ECHOKV_RETURN_IF_ERROR(builder.AddTensor(t.name, t.dtype, t.shape, t.data));
  }
  return builder.Finish();
}

}  // namespace echokv::state
