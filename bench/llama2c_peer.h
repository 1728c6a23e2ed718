// llama2.c's `run` as a peer of echokv-bench-model: a binary the user built from
// karpathy/llama2.c with its own Makefile (`make run`, `make runfast` or `make runomp`),
// run on exactly echokv's weights and timed per position from what it prints. None of
// llama2.c's code is in this repository: this file writes the peer's input files and
// reads its output.
//
// How it is driven. WriteLlama2cCheckpoint (tools/llama2c_export.h) writes the weights.
// The tokenizer written here names every id "[id]" and id 35 " ", so no two pieces ever
// merge and run.c encodes a prompt of n 'a's as BOS, its dummy-prefix space (35) and n
// byte-fallback ids 100 ('a' + 3), and every id it prints can be read back. With more
// prompt tokens than steps (-n S), each of the S steps is one forward pass at the next
// position on a forced prompt token: no sampling, no early stop at a generated BOS, the
// same work as a decode step there. run.c flushes stdout after every step, so the moment
// a piece arrives on the pipe marks the end of that position's forward pass.
//
//   ECHOKV_ASSIGN_OR_RETURN(Llama2cInputs in, WriteLlama2cInputs(model_dir, work_dir, 704));
//   ECHOKV_ASSIGN_OR_RETURN(Llama2cTiming t, TimeLlama2c(in, {"runfast", "/opt/llama2.c/run"}, 1, 448, 256));
//   // t.decode_tokens_per_second: positions 448..703, one token each
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<int> ids, Llama2cGreedy(in, peer, 1, 14, 32));
#ifndef ECHOKV_BENCH_LLAMA2C_PEER_H_
#define ECHOKV_BENCH_LLAMA2C_PEER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace echokv::bench {

// A peer binary and the name its columns carry.
struct Llama2cBinary {
  std::string label;  // e.g. "runfast"
  std::string path;   // the `run` binary
};

// "[LABEL=]PATH,[LABEL=]PATH,...": a label defaults to the file name. INVALID_ARGUMENT
// naming `flag` for an empty entry or a path that is not an executable file.
absl::StatusOr<std::vector<Llama2cBinary>> ParseLlama2cBinaries(absl::string_view list, absl::string_view flag);

// The peer's input files in `dir` (created if missing): model.bin (context length
// `seq_len`) and tok.bin.
struct Llama2cInputs {
  std::string checkpoint;
  std::string tokenizer;
  int64_t seq_len = 0;
};
absl::StatusOr<Llama2cInputs> WriteLlama2cInputs(const std::string& model_dir, const std::string& dir,
                                                 int64_t seq_len);

// The tokenizer described above for a vocabulary of `vocab` ids (>= 101), at `path`.
absl::Status WriteIdTokenizer(int vocab, const std::string& path);
// The ids of what run.c printed with that tokenizer ("[12][7] [3]" -> 12, 7, 35, 3);
// INVALID_ARGUMENT on anything else. A trailing newline is ignored.
absl::StatusOr<std::vector<int>> ParseIdPieces(absl::string_view printed);

struct Llama2cTiming {
  int64_t first_position = 0;           // the timed positions: [first_position, end_position)
  int64_t end_position = 0;
  double decode_tokens_per_second = 0;  // those positions, from the pieces' arrival times
  double run_c_tokens_per_second = 0;   // run.c's own "achieved tok/s" (positions 1..S-1)
};
// Runs `bin` with OMP_NUM_THREADS=`threads` for context + decode steps and times the
// forward passes at positions context .. context+decode-1 (from position 2 when context
// < 2: run.c prints nothing for position 0). INTERNAL with the peer's stderr when it
// fails or prints something else; INVALID_ARGUMENT when the steps exceed inputs.seq_len.
absl::StatusOr<Llama2cTiming> TimeLlama2c(const Llama2cInputs& inputs, const Llama2cBinary& bin, int threads,
                                          int64_t context, int64_t decode);

// The prompt ids run.c makes of `a_count` 'a's: 1, 35, then a_count times 100.
std::vector<int> Llama2cPromptIds(int a_count);
// run.c's greedy continuation (-t 0) of that prompt: up to `tokens` ids (fewer when it
// samples BOS, where run.c stops).
absl::StatusOr<std::vector<int>> Llama2cGreedy(const Llama2cInputs& inputs, const Llama2cBinary& bin, int threads,
                                               int a_count, int tokens);

}  // namespace echokv::bench

#endif  // ECHOKV_BENCH_LLAMA2C_PEER_H_
