// A scripted LookaheadDecoder for the policy tests: each step appends one KV entry per
// layer to the view (like the real model, at view->next_position(), which it then
// advances), returns logits whose argmax is a scripted token and per-layer queries
// from a script, and records what it saw (token, position, the view's positions and
// keys) so tests can check which entries each lookahead step attended to.
//
//   FakeDecoder dec(/*layers=*/1, /*heads=*/4, /*kv_heads=*/2, /*head_dim=*/8, /*vocab=*/16);
//   dec.queries = [](int step, int layer) { return PointAt(...); };   // [H, d]
//   in.decoder = &dec;
//   ... Compress(cfg, in) ...;
//   EXPECT_EQ(dec.calls.size(), 8);
#ifndef ECHOKV_TESTS_COMPRESSION_FAKE_DECODER_H_
#define ECHOKV_TESTS_COMPRESSION_FAKE_DECODER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/policy.h"
#include "model/kv_cache.h"

namespace echokv::compression::testing {

class FakeDecoder : public LookaheadDecoder {
 public:
  // What one DecodeStep saw.
  struct Call {
    int token = 0;                          // the token decoded
    int64_t position = 0;                   // view->next_position() at the call
    std::vector<at::Tensor> view_positions; // per layer [G, n] positions, incl. its own entry
    std::vector<at::Tensor> view_keys;      // per layer [G, n, d] keys, incl. its own entry
  };

  FakeDecoder(int num_layers, int num_heads, int num_kv_heads, int head_dim, int vocab)
      : num_layers_(num_layers),
        num_heads_(num_heads),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        vocab_(vocab) {}

  // Script: the argmax token of step `step` (0-based). Default: (step + 1) % vocab.
  std::function<int(int step)> next_token;
  // Script: the [H, d] queries of `layer` at step `step`. Default: zeros.
  std::function<at::Tensor(int step, int layer)> queries;
  // When >= 0, the step with this index fails with an Internal error.
  int fail_at = -1;

  // The key / value every layer appends at step `step`: constant 100 + step / -(100 + step).
  static float AppendedKey(int step) { return 100.0f + static_cast<float>(step); }

  absl::StatusOr<Step> DecodeStep(int token, model::KvCache* view) override {
    const int step_index = static_cast<int>(calls.size());
    if (step_index == fail_at) return absl::InternalError("fake decoder failure");
    const int64_t pos = view->next_position();
    const int64_t pos_arr[1] = {pos};
    for (int l = 0; l < num_layers_; ++l) {
      at::Tensor k = at::full({num_kv_heads_, 1, head_dim_}, AppendedKey(step_index));
      at::Tensor v = at::full({num_kv_heads_, 1, head_dim_}, -AppendedKey(step_index));
      absl::Status s = view->Append(l, k, v, pos_arr);
      if (!s.ok()) return s;
    }
    view->set_next_position(pos + 1);
    Call call;
    call.token = token;
    call.position = pos;
    for (int l = 0; l < num_layers_; ++l) {
      call.view_positions.push_back(view->positions(l));
      call.view_keys.push_back(view->keys(l).clone());
    }
    calls.push_back(std::move(call));

    Step step;
    const int next = next_token ? next_token(step_index) : (step_index + 1) % vocab_;
    step.logits = at::zeros({vocab_});
    step.logits[next] = 1.0f;
    for (int l = 0; l < num_layers_; ++l) {
      step.queries.push_back(queries ? queries(step_index, l)
                                     : at::zeros({num_heads_, head_dim_}));
    }
    return step;
  }

  std::vector<Call> calls;  // one per DecodeStep, in order

 private:
  int num_layers_;    // layers of the views it decodes on
  int num_heads_;     // H
  int num_kv_heads_;  // G
  int head_dim_;      // d
  int vocab_;         // V
};

}  // namespace echokv::compression::testing

#endif  // ECHOKV_TESTS_COMPRESSION_FAKE_DECODER_H_
