// The model fingerprint: 128-bit XXH3 over everything that defines a model's numbers —
// config.json bytes, then every tensor's name, dtype, shape and weight bytes in name
// order. Model-free: the engine feeds plain bytes (e.g. from the mmapped safetensors).
// A session (on disk or in a snapshot) is only served by a server with the same
// fingerprint.
//
//   state::FingerprintBuilder fp;
//   fp.AddConfig(config_json_bytes);
//   for (const auto& name : sorted_tensor_names)   // strictly increasing names
//     ECHOKV_RETURN_IF_ERROR(fp.AddTensor(name, "F32", shape, bytes));
//   ECHOKV_ASSIGN_OR_RETURN(state::ModelFingerprint model, fp.Finish());
#ifndef ECHOKV_SERVER_STATE_FINGERPRINT_H_
#define ECHOKV_SERVER_STATE_FINGERPRINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/state/types.h"

namespace echokv::state {

// Hashes, in this order (all integers u64 little-endian):
//   "echokv-model-fingerprint-v1" (27 bytes), len(config), config,
//   then per tensor: len(name), name, len(dtype), dtype, rank, dims..., len(data), data.
// Every length is written, so no two different inputs share a byte stream.
class FingerprintBuilder {
 public:
  FingerprintBuilder();
  ~FingerprintBuilder();
  FingerprintBuilder(const FingerprintBuilder&) = delete;
  FingerprintBuilder& operator=(const FingerprintBuilder&) = delete;

  // Exactly once, before any tensor: the bytes of config.json as on disk.
  absl::Status AddConfig(absl::string_view config_json);
  // name: the checkpoint's tensor name; names must be strictly increasing (byte order).
  // dtype: the checkpoint's dtype string ("F32", "BF16", ...). data: the tensor's bytes.
  absl::Status AddTensor(absl::string_view name, absl::string_view dtype,
                         absl::Span<const int64_t> shape, absl::string_view data);
  // The fingerprint; FAILED_PRECONDITION without a config or after an earlier error.
  absl::StatusOr<ModelFingerprint> Finish();

 private:
  void* state_;               // XXH3_state_t* (128-bit), owned
  bool has_config_ = false;   // AddConfig was called
  bool failed_ = false;       // an Add call failed: Finish refuses
  bool finished_ = false;     // Finish was called
  std::string last_name_;     // the previous tensor's name (order check)
  bool has_tensor_ = false;   // last_name_ is set
};

// One tensor for ComputeModelFingerprint (views; nothing is copied).
struct TensorDigestInput {
  absl::string_view name;
  absl::string_view dtype;
  std::vector<int64_t> shape;
  absl::string_view data;
};

// The same fingerprint in one call; sorts the tensors by name first (duplicate names ->
// INVALID_ARGUMENT).
absl::StatusOr<ModelFingerprint> ComputeModelFingerprint(absl::string_view config_json,
                                                         std::vector<TensorDigestInput> tensors);

}  // namespace echokv::state

#endif  // ECHOKV_SERVER_STATE_FINGERPRINT_H_
