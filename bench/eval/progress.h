// echokv-eval's progress report on stderr. On a terminal one line is redrawn in place
// ("\r"); anywhere else (CI logs, files, pipes) a carriage-return stream turns into one
// enormous line, so progress comes as separate lines, at most one per `min_interval`
// seconds (plus the first case and the last, so a log always shows start and end).
//
//   ProgressReporter progress(isatty(fileno(stderr)), /*min_interval_s=*/5);
//   for (...) { ...; std::fputs(progress.Update(i + 1, total, elapsed).c_str(), stderr); }
//   std::fputs(progress.Finish().c_str(), stderr);
#ifndef ECHOKV_BENCH_EVAL_PROGRESS_H_
#define ECHOKV_BENCH_EVAL_PROGRESS_H_

#include <cstddef>
#include <string>

namespace echokv::eval {

// "45s", "2m05s": whole seconds, rounded.
std::string FormatSeconds(double seconds);

class ProgressReporter {
 public:
  ProgressReporter(bool terminal, double min_interval_s) : terminal_(terminal), min_interval_s_(min_interval_s) {}

  // `done` of `total` cases after `elapsed_s` seconds (skipped cases count as done).
  // Returns what to write to stderr now; empty when nothing is due.
  std::string Update(size_t done, size_t total, double elapsed_s);

  // After the last Update: ends the redrawn terminal line; "" otherwise.
  std::string Finish() const;

 private:
  bool terminal_;
  double min_interval_s_;
  bool printed_ = false;
  double last_print_s_ = 0;
};

}  // namespace echokv::eval

#endif  // ECHOKV_BENCH_EVAL_PROGRESS_H_
