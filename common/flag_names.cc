#include "common/flag_names.h"

namespace echokv {

DashedFlagArgs::DashedFlagArgs(int argc, char** argv) {
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && !flags_done) {
      if (a == "--") {
        flags_done = true;
      } else if (a.size() > 2 && a[0] == '-') {
        const size_t start = a[1] == '-' ? 2 : 1;
        const size_t end = a.find('=');
        for (size_t j = start; j < a.size() && j < end; ++j) {
          if (a[j] == '-') a[j] = '_';
        }
      }
    }
    storage_.push_back(std::move(a));
  }
  for (std::string& s : storage_) ptrs_.push_back(s.data());
  ptrs_.push_back(nullptr);
}

}  // namespace echokv
