// echokv-export-gguf: a Hugging Face Llama / Mistral / Qwen2 checkpoint as one GGUF file
// in llama.cpp's layout (tools/gguf_export.h): for the GGUF tests, and to run llama.cpp
// and echokv on the same weights in any storage type.
//
//   echokv-export-gguf --model /tmp/tiny-llama --out /tmp/tiny-llama.gguf --type q8_0
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/flag_names.h"
#include "tools/gguf_export.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (config.json + safetensors)");
ABSL_FLAG(std::string, out, "", "GGUF file to write");
ABSL_FLAG(std::string, type, "f32", "storage of the matrices: f32, f16, bf16, q8_0, q4_k or q6_k (norms and biases stay f32)");
ABSL_FLAG(std::string, embedding_type, "", "storage of the embedding when it differs from --type");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("echokv-export-gguf --model DIR --out FILE.gguf [--type f32|f16|q8_0]");
  echokv::DashedFlagArgs dashed(argc, argv);
  absl::ParseCommandLine(dashed.argc(), dashed.argv());
  const std::string model = absl::GetFlag(FLAGS_model), out = absl::GetFlag(FLAGS_out);
  if (model.empty() || out.empty()) {
    std::fprintf(stderr, "usage: %s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  echokv::tools::GgufExportOptions o;
  o.type = absl::GetFlag(FLAGS_type);
  o.embedding_type = absl::GetFlag(FLAGS_embedding_type);
  if (absl::Status s = echokv::tools::ExportGguf(model, out, o); !s.ok()) {
    std::fprintf(stderr, "echokv-export-gguf: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
