// Runs a command line for CLI tests and captures stdout, stderr and the exit code.
//
//   CommandResult r = RunCommand(std::string(ECHOKV_GENERATE_BIN) + " --model " + dir);
//   EXPECT_EQ(r.exit_code, 0) << r.err;
#ifndef ECHOKV_TESTS_TESTING_SUBPROCESS_H_
#define ECHOKV_TESTS_TESTING_SUBPROCESS_H_

#include <string>

namespace echokv::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the command did not exit normally
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs `command_line` through /bin/sh (arguments must already be quoted).
CommandResult RunCommand(const std::string& command_line);

}  // namespace echokv::testing

#endif  // ECHOKV_TESTS_TESTING_SUBPROCESS_H_
