// echokv-generate: offline generation with optional KV-cache compression, on the
// same code the server uses (compression::PrefillAndCompress + Transformer::Decode).
//
//   echokv-generate --prompt "Once upon a time"      # the embedded stories260K
//   echokv-generate --model DIR --prompt "Once upon a time" --max-tokens 64 --json
//   echokv-generate --model DIR --prompt-ids 1,403,407 --policy echokv --budget 64
//       --lookahead 8 --workspace 128 --json --dump-retained
//
// With --json it prints one JSON object:
//   {"prompt_ids":[…],"output_ids":[…],"text":"…","stop_reason":"length|eos|stop_id",
//    "timings_ms":{"prefill":…,"compression":…,"decode":…},"compression":{…report…},
//    "runtime":{"threads":N,"blas":"OpenBLAS core …","attention_kernel":"avx512|avx2|scalar"},
//    "retained":[[positions of group 0 of layer 0],…]}   (retained with --dump-retained)
// Without --json the text streams to stdout and a summary goes to stderr.
// Errors go to stderr with exit code 1 (2 for usage errors).
// Without --model: $ECHOKV_MODEL, else the embedded stories260K (common/default_model.h).
//
// Positions: the last generated token is never fed back, so a prompt of P tokens may
// generate up to max_position_embeddings - P + 1 (llama2.c's run.c does the same).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/blas_env.h"
#include "kernels/attention.h"
#include "common/default_model.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flag_names.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "compression/config.h"
#include "compression/pipeline.h"
#include "compression/report.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "",
          "The model: a .gguf file or a Hugging Face directory (config.json, *.safetensors, tokenizer); "
          "default $ECHOKV_MODEL, else SmolLM2-135M-Instruct.Q4_1.gguf in the models folder, else the "
          "embedded stories260K");
ABSL_FLAG(std::string, prompt, "", "prompt text (tokenized with the model's tokenizer)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids (instead of --prompt)");
ABSL_FLAG(int, max_tokens, 64, "maximum tokens to generate (>= 1)");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature; 0 = greedy");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling mass in (0, 1]");
ABSL_FLAG(int, top_k, 0, "top-k cut; 0 = off");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(double, min_p, 0.0, "min-p cut in [0, 1]: drop tokens below min_p * the top probability; 0 = off");
ABSL_FLAG(double, repetition_penalty, 1.0, "> 0; divides positive / multiplies negative logits of prompt and output ids");
ABSL_FLAG(double, presence_penalty, 0.0, "[-2, 2]; subtracted from the logits of ids generated before");
ABSL_FLAG(double, frequency_penalty, 0.0, "[-2, 2]; times the count, subtracted from the logits of generated ids");
ABSL_FLAG(bool, logprobs, false, "with --json: the raw log-probability of each output token");
ABSL_FLAG(int, top_logprobs, 0, "with --logprobs: also the N (<= 20) most likely tokens at each step");
ABSL_FLAG(std::string, stop_ids, "", "extra comma-separated token ids that end the generation");
ABSL_FLAG(bool, json, false, "print one JSON object instead of streaming text");
ABSL_FLAG(std::string, policy, "full", "full|streamingllm|h2o|snapkv|pyramidkv|laq|echokv");
ABSL_FLAG(int, budget, 512, "entries kept per layer and KV group (B)");
ABSL_FLAG(int, lookahead, 8, "lookahead steps T (laq, echokv; even)");
ABSL_FLAG(int, workspace, 0, "workspace capacity B1 (0 = policy default: 1024 echokv, B laq)");
ABSL_FLAG(int, window, 0, "stage-2 window w: most recent tokens always kept (echokv)");
ABSL_FLAG(std::string, bootstrap, "proposals", "echokv bootstrap: proposals|snapkv");
ABSL_FLAG(std::string, repair, "on", "echokv workspace repair: on|off");
ABSL_FLAG(bool, dump_retained, false, "with --json: add the retained positions per layer and group");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda[:N]");
ABSL_FLAG(std::string, dtype, "float32", "float32 | bfloat16 | float16");
ABSL_FLAG(std::string, weights, "float32", "float32 | native (a GGUF file's quantized blocks as stored; CPU float32)");
ABSL_FLAG(int, threads, 0, "compute threads (0 = $ECHOKV_THREADS or all cores)");

namespace {

using echokv::compression::CompressionConfig;

absl::StatusOr<std::vector<int>> ParseIds(const std::string& text, const char* flag) {
  std::vector<int> ids;
  if (text.empty()) return ids;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "' is not an integer token id"));
    }
    ids.push_back(v);
  }
  return ids;
}

absl::StatusOr<CompressionConfig> ConfigFromFlags() {
  CompressionConfig c;
  ECHOKV_ASSIGN_OR_RETURN(c.policy, echokv::compression::ParsePolicyKind(absl::GetFlag(FLAGS_policy)));
  c.budget = absl::GetFlag(FLAGS_budget);
  c.lookahead = absl::GetFlag(FLAGS_lookahead);
  if (absl::GetFlag(FLAGS_workspace) != 0) c.workspace = absl::GetFlag(FLAGS_workspace);
  c.stage2_window = absl::GetFlag(FLAGS_window);
  ECHOKV_ASSIGN_OR_RETURN(c.bootstrap, echokv::compression::ParseBootstrap(absl::GetFlag(FLAGS_bootstrap)));
  const std::string repair = absl::GetFlag(FLAGS_repair);
  if (repair != "on" && repair != "off") {
    return absl::InvalidArgumentError(absl::StrCat("repair must be on or off, got '", repair, "'"));
  }
  c.repair = repair == "on";
  ECHOKV_RETURN_IF_ERROR(c.Validate());
  return c;
}

double Ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

absl::Status Run() {
  ECHOKV_ASSIGN_OR_RETURN(const std::string dir, echokv::ResolveModelDir(absl::GetFlag(FLAGS_model)));
  const bool has_text = !absl::GetFlag(FLAGS_prompt).empty();
  const bool has_ids = !absl::GetFlag(FLAGS_prompt_ids).empty();
  if (has_text == has_ids) return absl::InvalidArgumentError("give exactly one of --prompt and --prompt-ids");
  if (absl::GetFlag(FLAGS_max_tokens) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens must be >= 1, got ", absl::GetFlag(FLAGS_max_tokens)));
  }
  // Validate every flag before the (slow) model load.
  ECHOKV_ASSIGN_OR_RETURN(CompressionConfig config, ConfigFromFlags());
  echokv::model::SamplingParams sampling;
  sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  sampling.top_k = absl::GetFlag(FLAGS_top_k);
  sampling.seed = absl::GetFlag(FLAGS_seed);
  sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  sampling.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  sampling.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  sampling.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  sampling.logprobs = absl::GetFlag(FLAGS_logprobs);
  sampling.top_logprobs = absl::GetFlag(FLAGS_top_logprobs);
  ECHOKV_RETURN_IF_ERROR(sampling.Validate());
  ECHOKV_ASSIGN_OR_RETURN(std::vector<int> stop_ids, ParseIds(absl::GetFlag(FLAGS_stop_ids), "stop-ids"));

  echokv::model::DeviceOptions device;
  device.device = absl::GetFlag(FLAGS_device);
  device.dtype = absl::GetFlag(FLAGS_dtype);
  device.weights = absl::GetFlag(FLAGS_weights);
  device.num_threads = absl::GetFlag(FLAGS_threads);
  ECHOKV_RETURN_IF_ERROR(device.Validate());
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<echokv::model::Transformer> model,
                          echokv::model::Transformer::Load(dir, device));
  const echokv::model::ModelConfig& mc = model->config();

  // The tokenizer is required for --prompt and optional (text output) for --prompt-ids.
  std::unique_ptr<echokv::model::Tokenizer> tokenizer;
  auto tok = echokv::model::LoadTokenizer(dir);
  if (tok.ok()) {
    tokenizer = std::move(*tok);
  } else if (has_text) {
    return tok.status();
  }
  std::vector<int> prompt;
  if (has_text) {
    ECHOKV_ASSIGN_OR_RETURN(prompt, tokenizer->Encode(absl::GetFlag(FLAGS_prompt)));
    if (prompt.empty()) return absl::InvalidArgumentError("--prompt encodes to no tokens");
  } else {
    ECHOKV_ASSIGN_OR_RETURN(prompt, ParseIds(absl::GetFlag(FLAGS_prompt_ids), "prompt-ids"));
  }
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  // Prefill feeds positions 0 .. P-1 and every output token but the last is fed back
  // (P .. P+N-2), so P + N - 1 positions must fit.
  const int64_t room = static_cast<int64_t>(mc.max_position_embeddings) - static_cast<int64_t>(prompt.size()) + 1;
  if (max_tokens > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-tokens: prompt (", prompt.size(), " tokens) + --max-tokens (", max_tokens,
        ") - 1 (the last token is not fed back) exceeds the model's max_position_embeddings (",
        mc.max_position_embeddings, "): at most ", std::max<int64_t>(room, 0), " tokens after this prompt"));
  }

  echokv::compression::PipelineOptions po;
  ECHOKV_ASSIGN_OR_RETURN(echokv::compression::CompressedContext ctx,
                          echokv::compression::PrefillAndCompress(*model, prompt, model->NewCache(), config, po));
  const auto t1 = std::chrono::steady_clock::now();

  echokv::model::StopCriteria stop;
  stop.max_tokens = max_tokens;
  stop.eos_ids = mc.eos_token_ids;
  stop.stop_ids = stop_ids;
  echokv::model::Sampler sampler(sampling, prompt);
  std::unique_ptr<echokv::model::IncrementalDecoder> stream;
  if (tokenizer && !absl::GetFlag(FLAGS_json)) {
    // The prompt is the decoder's context: the text is Decode(prompt + output) minus
    // Decode(prompt), so the first token keeps its leading space.
    stream = std::make_unique<echokv::model::IncrementalDecoder>(tokenizer.get(), prompt);
  }
  std::vector<int> output;
  std::vector<echokv::model::SampledToken> sampled;  // per output token (logprobs)
  echokv::model::StopReason reason = echokv::model::StopReason::kNone;
  at::Tensor logits = ctx.last_logits;
  while (reason == echokv::model::StopReason::kNone) {
    echokv::model::SampledToken t = sampler.Next(absl::MakeConstSpan(logits.data_ptr<float>(), logits.numel()));
    const int next = t.token;
    reason = stop.Check(next, static_cast<int>(output.size()) + 1);
    if (reason == echokv::model::StopReason::kEos || reason == echokv::model::StopReason::kStopId) break;
    output.push_back(next);
    sampled.push_back(std::move(t));
    if (stream) {
      ECHOKV_ASSIGN_OR_RETURN(std::string delta, stream->Add(next));
      std::cout << delta << std::flush;
    }
    if (reason != echokv::model::StopReason::kNone) break;  // length reached: no extra decode
    ECHOKV_ASSIGN_OR_RETURN(echokv::model::DecodeResult step, model->Decode(next, &ctx.cache));
    logits = step.logits;
  }
  const auto t2 = std::chrono::steady_clock::now();
  if (stream) {
    ECHOKV_ASSIGN_OR_RETURN(std::string tail, stream->Finish());
    std::cout << tail << std::endl;
  }

  const double prefill_ms = ctx.report.SecondsOf("prefill") * 1e3;
  const double compression_ms = ctx.report.TotalSeconds(/*include_prefill=*/false) * 1e3;
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json j;
    j["prompt_ids"] = prompt;
    j["output_ids"] = output;
    std::string text;
    if (tokenizer) {
      ECHOKV_ASSIGN_OR_RETURN(text, echokv::model::DecodeContinuation(*tokenizer, prompt, output));
    }
    j["text"] = text;
    j["stop_reason"] = std::string(echokv::model::StopReasonName(reason));
    if (sampling.logprobs) {
      // Raw log_softmax of the model's logits (model/sampler.h); -inf never occurs for
      // a sampled token unless every logit is -inf.
      nlohmann::ordered_json lp = nlohmann::ordered_json::array();
      for (const echokv::model::SampledToken& t : sampled) {
        nlohmann::ordered_json e;
        e["token"] = t.token;
        e["logprob"] = t.logprob;
        nlohmann::ordered_json top = nlohmann::ordered_json::array();
        for (const echokv::model::TokenLogprob& a : t.top_logprobs) top.push_back({{"token", a.token}, {"logprob", a.logprob}});
        e["top_logprobs"] = top;
        lp.push_back(e);
      }
      j["logprobs"] = lp;
    }
    j["timings_ms"] = {{"prefill", prefill_ms}, {"compression", compression_ms}, {"decode", Ms(t1, t2)}};
    // What this process chose at start (threads, OpenBLAS core and who set it, the
    // attention kernel build): the model's load line, which scripts do not see.
    j["runtime"] = {{"threads", model->pool_trace().threads},
                    {"blas", echokv::DescribeBlasSetup()},
                    {"attention_kernel", echokv::kernels::AttentionIsa()}};
    j["compression"] = nlohmann::ordered_json::parse(echokv::compression::ReportToJson(ctx.report));
    if (absl::GetFlag(FLAGS_dump_retained)) {
      // Positions held after compression (before generation appended anything):
      // the kept context entries, layer-major, then group.
      nlohmann::json retained = nlohmann::json::array();
      const auto& cells = ctx.cache.cells();
      for (int l = 0; l < cells.num_layers(); ++l) {
        for (int g = 0; g < cells.num_kv_heads(); ++g) {
          std::vector<int64_t> pos;
          for (int64_t p : cells.positions(l, g)) {
            if (p < static_cast<int64_t>(prompt.size())) pos.push_back(p);
          }
          retained.push_back(pos);
        }
      }
      j["retained"] = retained;
    }
    std::cout << j.dump() << std::endl;
  } else {
    std::fprintf(stderr,
                 "[%zu prompt tokens, %zu generated, stop: %s; prefill %.1f ms, compression %.1f ms (%s, %lld of "
                 "%lld KV bytes kept), decode %.1f ms]\n",
                 prompt.size(), output.size(), std::string(echokv::model::StopReasonName(reason)).c_str(), prefill_ms,
                 compression_ms, std::string(echokv::compression::PolicyName(config.policy)).c_str(),
                 static_cast<long long>(ctx.report.retained_kv_bytes), static_cast<long long>(ctx.report.full_kv_bytes),
                 Ms(t1, t2));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  echokv::ConfigureBlasWorkersOrReexec(argv);
  absl::SetProgramUsageMessage(
      "echokv-generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N] [--policy NAME "
      "--budget B ...] [--json]");
  echokv::DashedFlagArgs dashed(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(dashed.argc(), dashed.argv());
  if (args.size() > 1) {
    std::fprintf(stderr, "echokv-generate: unexpected argument '%s' (see --help)\n", args[1]);
    return 2;
  }
  FLAGS_minloglevel = 1;  // keep stdout/stderr clean for scripts; warnings still show
  echokv::InitLogging(argv[0]);
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "echokv-generate: error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
