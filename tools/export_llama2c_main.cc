// echokv-export-llama2c: a Hugging Face Llama checkpoint (F32 safetensors) as llama2.c's
// legacy checkpoint `.bin`, and optionally a SentencePiece tokenizer.model as llama2.c's
// tokenizer `.bin` — the inputs of llama.cpp's llama-convert-llama2c-to-ggml, so the
// peer runs on exactly echokv's weights (bench/llamacpp_compare.sh).
//
//   echokv-export-llama2c --model models/stories260K --out /tmp/s260k.bin
//       --tokenizer-model models/stories260K/tokenizer.model --tokenizer-out /tmp/tok512.bin
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/flag_names.h"
#include "tools/llama2c_export.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (config.json + F32 model.safetensors)");
ABSL_FLAG(std::string, out, "", "llama2.c checkpoint .bin to write");
ABSL_FLAG(std::string, tokenizer_model, "", "SentencePiece tokenizer.model to export (optional)");
ABSL_FLAG(std::string, tokenizer_out, "", "llama2.c tokenizer .bin to write (with --tokenizer-model)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "echokv-export-llama2c --model DIR --out FILE.bin [--tokenizer-model tokenizer.model --tokenizer-out tok.bin]");
  echokv::DashedFlagArgs dashed(argc, argv);
  absl::ParseCommandLine(dashed.argc(), dashed.argv());
  const std::string model = absl::GetFlag(FLAGS_model), out = absl::GetFlag(FLAGS_out);
  const std::string tok_model = absl::GetFlag(FLAGS_tokenizer_model), tok_out = absl::GetFlag(FLAGS_tokenizer_out);
  if (model.empty() != out.empty() || tok_model.empty() != tok_out.empty() || (model.empty() && tok_model.empty())) {
    std::fprintf(stderr, "usage: %s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  if (!model.empty()) {
    if (absl::Status s = echokv::tools::WriteLlama2cCheckpoint(model, out); !s.ok()) {
      std::fprintf(stderr, "echokv-export-llama2c: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("wrote %s\n", out.c_str());
  }
  if (!tok_model.empty()) {
    if (absl::Status s = echokv::tools::WriteLlama2cTokenizer(tok_model, tok_out); !s.ok()) {
      std::fprintf(stderr, "echokv-export-llama2c: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("wrote %s\n", tok_out.c_str());
  }
  return 0;
}
