#include "bench/llama2c_peer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/llama2c_export.h"

extern char** environ;

namespace echokv::bench {
namespace {

constexpr int kSpaceId = 35;   // run.c's dummy prefix " " (byte 32 + 3)
constexpr int kAId = 100;      // 'a' by byte fallback (97 + 3)
constexpr char kAPiece[] = "[100]";

std::string Piece(int id) { return id == kSpaceId ? std::string(" ") : absl::StrCat("[", id, "]"); }

// What one run of the peer printed, and when each stdout chunk arrived.
struct RunOutput {
  std::string out;
  // (bytes of stdout received so far, time they had arrived), one per read.
  std::vector<std::pair<size_t, std::chrono::steady_clock::time_point>> arrivals;
  std::string err;
};

// Runs `argv` with OMP_NUM_THREADS=`threads`, stdout on a pipe read here, stderr to
// `err_path`. INTERNAL when it cannot start or exits non-zero (its stderr quoted).
absl::StatusOr<RunOutput> RunPeer(const std::vector<std::string>& argv, int threads, const std::string& err_path) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "OMP_NUM_THREADS=", 16) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back(absl::StrCat("OMP_NUM_THREADS=", threads));
  std::vector<char*> envp, args;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("cannot create ", err_path, ": ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  close(err_fd);
  RunOutput r;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.out.append(buf, static_cast<size_t>(n));
    r.arrivals.emplace_back(r.out.size(), std::chrono::steady_clock::now());
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream err(err_path);
  std::stringstream ss;
  ss << err.rdbuf();
  r.err = ss.str();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(argv[0], " failed (", WIFEXITED(status) ? "exit " : "signal ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                                            "): ", r.err.substr(0, 600)));
  }
  return r;
}

std::vector<std::string> PeerArgs(const Llama2cInputs& in, const Llama2cBinary& bin, int64_t steps, int a_count) {
  return {bin.path, in.checkpoint, "-z", in.tokenizer, "-t", "0", "-n", absl::StrCat(steps),
          "-i", std::string(static_cast<size_t>(a_count), 'a')};
}

}  // namespace

absl::StatusOr<std::vector<Llama2cBinary>> ParseLlama2cBinaries(absl::string_view list, absl::string_view flag) {
  std::vector<Llama2cBinary> out;
  if (list.empty()) return out;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    Llama2cBinary b;
    const size_t eq = entry.find('=');
    b.path = std::string(eq == absl::string_view::npos ? entry : entry.substr(eq + 1));
    if (eq != absl::string_view::npos) b.label = std::string(entry.substr(0, eq));
    if (b.label.empty()) b.label = std::filesystem::path(b.path).filename().string();
    struct stat st;
    if (b.path.empty() || stat(b.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || access(b.path.c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", entry, "' is not an executable file (llama2.c's ",
                                                     "`run`, built with its own Makefile)"));
    }
    out.push_back(std::move(b));
  }
  return out;
}

absl::Status WriteIdTokenizer(int vocab, const std::string& path) {
  if (vocab <= kAId) return absl::InvalidArgumentError(absl::StrCat("vocab_size ", vocab, " < ", kAId + 1));
  std::string bytes;
  auto put_i32 = [&](int32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); };
  int32_t longest = 0;
  for (int i = 0; i < vocab; ++i) longest = std::max<int32_t>(longest, static_cast<int32_t>(Piece(i).size()));
  put_i32(longest);
  for (int i = 0; i < vocab; ++i) {
    const float score = 0.0f;
    bytes.append(reinterpret_cast<const char*>(&score), 4);
    const std::string p = Piece(i);
    put_i32(static_cast<int32_t>(p.size()));
    bytes += p;
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ParseIdPieces(absl::string_view printed) {
  std::vector<int> ids;
  if (!printed.empty() && printed.back() == '\n') printed.remove_suffix(1);
  size_t i = 0;
  while (i < printed.size()) {
    if (printed[i] == ' ') {
      ids.push_back(kSpaceId);
      ++i;
      continue;
    }
    const size_t close = printed.find(']', i);
    int id = 0;
    if (printed[i] != '[' || close == absl::string_view::npos ||
        !absl::SimpleAtoi(printed.substr(i + 1, close - i - 1), &id) || id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected output at byte ", i, ": '", printed.substr(i, 40), "'"));
    }
    ids.push_back(id);
    i = close + 1;
  }
  return ids;
}

absl::StatusOr<Llama2cInputs> WriteLlama2cInputs(const std::string& model_dir, const std::string& dir,
                                                 int64_t seq_len) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  Llama2cInputs in;
  in.checkpoint = dir + "/model.bin";
  in.tokenizer = dir + "/tok.bin";
  in.seq_len = seq_len;
  if (absl::Status s = tools::WriteLlama2cCheckpoint(model_dir, in.checkpoint, seq_len); !s.ok()) return s;
  // The vocabulary size is the checkpoint's (abs of the 6th int32 of its header).
  std::ifstream f(in.checkpoint, std::ios::binary);
  int32_t header[7] = {};
  f.read(reinterpret_cast<char*>(header), sizeof(header));
  if (!f) return absl::InternalError(absl::StrCat("cannot read back ", in.checkpoint));
  if (absl::Status s = WriteIdTokenizer(std::abs(header[5]), in.tokenizer); !s.ok()) return s;
  return in;
}

std::vector<int> Llama2cPromptIds(int a_count) {
  std::vector<int> ids = {1, kSpaceId};
  ids.insert(ids.end(), static_cast<size_t>(std::max(a_count, 0)), kAId);
  return ids;
}

absl::StatusOr<Llama2cTiming> TimeLlama2c(const Llama2cInputs& inputs, const Llama2cBinary& bin, int threads,
                                          int64_t context, int64_t decode) {
  const int64_t steps = context + decode;
  Llama2cTiming t;
  t.first_position = std::max<int64_t>(context, 2);
  t.end_position = steps;
  if (t.end_position - t.first_position < 1) {
    return absl::InvalidArgumentError(absl::StrCat("context ", context, " + decode ", decode, " leaves no position to time"));
  }
  if (steps > inputs.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(steps, " steps exceed the peer checkpoint's context of ", inputs.seq_len));
  }
  // More prompt tokens than steps: every step is a forced token.
  absl::StatusOr<RunOutput> r =
      RunPeer(PeerArgs(inputs, bin, steps, static_cast<int>(steps)), threads, inputs.checkpoint + ".stderr");
  if (!r.ok()) return r.status();
  // Step p >= 1 prints "[100]"; step 0 prints nothing (the space after BOS is stripped).
  const size_t piece = std::strlen(kAPiece);
  const std::string expected_out = [&] {
    std::string s;
    for (int64_t p = 1; p < steps; ++p) s += kAPiece;
    return s + "\n";
  }();
  if (r->out != expected_out) {
    return absl::InternalError(absl::StrCat(bin.path, " printed something else than ", steps - 1, " forced prompt ",
                                            "tokens (is it llama2.c's run?): '", r->out.substr(0, 80), "'"));
  }
  // When the piece printed after position p (p >= 1) had arrived.
  auto arrival = [&](int64_t p) {
    const size_t need = static_cast<size_t>(p) * piece;
    for (const auto& [bytes, when] : r->arrivals) {
      if (bytes >= need) return when;
    }
    return r->arrivals.back().second;
  };
  const double seconds =
      std::chrono::duration<double>(arrival(t.end_position - 1) - arrival(t.first_position - 1)).count();
  if (seconds <= 0) return absl::InternalError("the peer's output arrived all at once; nothing to time");
  t.decode_tokens_per_second = static_cast<double>(t.end_position - t.first_position) / seconds;
  const size_t at = r->err.find("achieved tok/s: ");
  if (at != std::string::npos) t.run_c_tokens_per_second = std::atof(r->err.c_str() + at + 16);
  return t;
}

absl::StatusOr<std::vector<int>> Llama2cGreedy(const Llama2cInputs& inputs, const Llama2cBinary& bin, int threads,
                                               int a_count, int tokens) {
  const int prompt = a_count + 2;
  const int64_t steps = prompt + tokens - 1;
  if (steps > inputs.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(steps, " steps exceed the peer checkpoint's context of ", inputs.seq_len));
  }
  absl::StatusOr<RunOutput> r = RunPeer(PeerArgs(inputs, bin, steps, a_count), threads, inputs.checkpoint + ".stderr");
  if (!r.ok()) return r.status();
  absl::StatusOr<std::vector<int>> ids = ParseIdPieces(r->out);
  if (!ids.ok()) {
    return absl::InternalError(absl::StrCat(bin.path, " (is it llama2.c's run?): ", ids.status().message()));
  }
  // The forced prompt tokens 2 .. prompt-1 come first (100 each), then what it sampled.
  const size_t forced = static_cast<size_t>(prompt - 2);
  if (ids->size() < forced || std::any_of(ids->begin(), ids->begin() + forced, [](int id) { return id != kAId; })) {
    return absl::InternalError(absl::StrCat(bin.path, " did not encode the prompt as llama2.c's run does: '",
                                            r->out.substr(0, 80), "'"));
  }
  return std::vector<int>(ids->begin() + forced, ids->end());
}

}  // namespace echokv::bench
