#include "bench/eval/progress.h"

#include "absl/strings/str_cat.h"

namespace echokv::eval {

std::string FormatSeconds(double s) {
  const int t = static_cast<int>(s + 0.5);
  return t >= 60 ? absl::StrCat(t / 60, "m", t % 60 < 10 ? "0" : "", t % 60, "s") : absl::StrCat(t, "s");
}

std::string ProgressReporter::Update(size_t done, size_t total, double elapsed_s) {
  const double eta = done > 0 ? elapsed_s / static_cast<double>(done) * static_cast<double>(total - done) : 0.0;
  const std::string text = absl::StrCat("[echokv-eval] ", done, "/", total, " cases  elapsed ", FormatSeconds(elapsed_s),
                                        "  ETA ", FormatSeconds(eta));
  if (terminal_) {
    printed_ = true;
    return absl::StrCat("\r", text, "   ");
  }
  const bool last = done >= total;
  if (printed_ && !last && elapsed_s - last_print_s_ < min_interval_s_) return "";
  printed_ = true;
  last_print_s_ = elapsed_s;
  return absl::StrCat(text, "\n");
}

std::string ProgressReporter::Finish() const { return terminal_ && printed_ ? "\n" : ""; }

}  // namespace echokv::eval
