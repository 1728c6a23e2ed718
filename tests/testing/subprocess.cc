#include "tests/testing/subprocess.h"

#include <sys/wait.h>

#include <cstdio>

#include "tests/testing/test_data.h"

namespace echokv::testing {

CommandResult RunCommand(const std::string& command_line) {
  const std::string err_file = MakeTempDir("echokv_cmd_") + "/stderr";
  CommandResult r;
  FILE* p = popen((command_line + " 2>" + err_file).c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = ReadFileOrDie(err_file);
  return r;
}

}  // namespace echokv::testing
