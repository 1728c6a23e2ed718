// echokv-make-eval-set: deterministically writes the stories260K evaluation set
// (bench/data/stories_eval.jsonl). Two kinds of case:
//   story-NN   the model's own text: from BOS, sampled at temperature 1.0 with seed NN
//              (model::Sampler), to a length in 350 ... 480 tokens fixed by NN
//   planted-NN a short intro that names a character ("... Her name was Mia. ..."), a
//              sampled continuation of it (seed 1000 + NN, BOS/EOS masked), cut at a
//              sentence end, then a cue ("Her name was") whose answer is the name;
//              evidence_spans cover the name's tokens in the intro.
// Same model, same flags -> byte-identical output.
//
//   echokv-make-eval-set --model /work/shared/models/stories260K
//       --out bench/data/stories_eval.jsonl --stories 40 --planted 10
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/eval/dataset.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

#include <ATen/ATen.h>

ABSL_FLAG(std::string, model, "", "stories260K model directory (required)");
ABSL_FLAG(std::string, out, "", "output JSONL path (required)");
ABSL_FLAG(int, stories, 40, "number of sampled story contexts");
ABSL_FLAG(int, planted, 10, "number of planted-detail cases");
ABSL_FLAG(int, min_tokens, 350, "shortest context");
ABSL_FLAG(int, max_tokens, 480, "longest context");
ABSL_FLAG(bool, preview, false, "print the full model's greedy answer for planted cases");

namespace {

using echokv::model::Tokenizer;
using echokv::model::Transformer;

// Character intros: (name, intro text). The cue at the end is "Her/His name was".
struct Plant {
  const char* name;
  const char* intro;
  const char* cue;
};
constexpr Plant kPlants[] = {
    {"Mia", "Once upon a time, there was a little girl. Her name was Mia. Mia liked to play outside. Everyone liked Mia. Mia was happy.", "Her name was"},
    {"Tom", "Once upon a time, there was a little boy. His name was Tom. Tom had a big red ball. Everyone liked Tom. Tom was happy.", "His name was"},
    {"Sue", "Once upon a time, there was a kind girl. Her name was Sue. Sue loved her garden. Everyone liked Sue. Sue was happy.", "Her name was"},
    {"Ben", "Once upon a time, there was a happy boy. His name was Ben. Ben liked to run. Everyone liked Ben. Ben was happy.", "His name was"},
    {"Lucy", "Once upon a time, there was a small girl. Her name was Lucy. Lucy had a pet cat. Everyone liked Lucy. Lucy was happy.", "Her name was"},
    {"Max", "Once upon a time, there was a brave boy. His name was Max. Max wanted to fly. Everyone liked Max. Max was happy.", "His name was"},
    {"Amy", "Once upon a time, there was a shy girl. Her name was Amy. Amy liked to draw. Everyone liked Amy. Amy was happy.", "Her name was"},
    {"Sam", "Once upon a time, there was a little boy. His name was Sam. Sam found a stick. Everyone liked Sam. Sam was happy.", "His name was"},
    {"Anna", "Once upon a time, there was a sweet girl. Her name was Anna. Anna had a doll. Everyone liked Anna. Anna was happy.", "Her name was"},
    {"Jack", "Once upon a time, there was a funny boy. His name was Jack. Jack liked his dog. Everyone liked Jack. Jack was happy.", "His name was"},
    {"Kim", "Once upon a time, there was a smart girl. Her name was Kim. Kim read a book. Everyone liked Kim. Kim was happy.", "Her name was"},
    {"Tim", "Once upon a time, there was a good boy. His name was Tim. Tim loved the sun. Everyone liked Tim. Tim was happy.", "His name was"},
};

// Target length of case `index` in [lo, hi] (a fixed spread, no RNG).
int TargetLength(int index, int lo, int hi) { return lo + (index * 53) % (hi - lo + 1); }

// Extends `ids` by sampling (temperature 1.0, `seed`) until it holds `target` tokens.
// With `mask_special`, BOS and EOS are never sampled (one continuous story).
absl::Status SampleTo(const Transformer& m, std::vector<int>* ids, int target, uint64_t seed,
                      bool mask_special) {
  echokv::model::KvCache cache = m.NewCache();
  ECHOKV_ASSIGN_OR_RETURN(echokv::model::ForwardResult pre, m.Forward(*ids, &cache));
  echokv::model::SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = seed;
  echokv::model::Sampler sampler(sp);
  at::Tensor logits = pre.logits;
  const auto& cfg = m.config();
  while (static_cast<int>(ids->size()) < target) {
    at::Tensor l = logits.to(at::kFloat).contiguous();
    std::vector<float> v(l.data_ptr<float>(), l.data_ptr<float>() + l.numel());
    if (mask_special) {
      if (cfg.bos_token_id >= 0) v[cfg.bos_token_id] = -1e30f;
      for (int e : cfg.eos_token_ids) v[e] = -1e30f;
    }
    const int next = sampler.Sample(v);
    ids->push_back(next);
    if (static_cast<int>(ids->size()) >= target) break;
    ECHOKV_ASSIGN_OR_RETURN(echokv::model::DecodeResult r, m.Decode(next, &cache));
    logits = r.logits;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> EncodeNoBos(const Tokenizer& tok, const std::string& text) {
  echokv::model::EncodeOptions eo;
  eo.add_special_tokens = false;
  return tok.Encode(text, eo);
}

absl::Status Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  if (out_path.empty()) return absl::InvalidArgumentError("--out is required");
  const int lo = absl::GetFlag(FLAGS_min_tokens), hi = absl::GetFlag(FLAGS_max_tokens);
  if (lo < 16 || hi < lo) return absl::InvalidArgumentError("--min_tokens/--max_tokens: need 16 <= min <= max");
  const int planted = absl::GetFlag(FLAGS_planted);
  if (planted < 0 || planted > static_cast<int>(std::size(kPlants))) {
    return absl::InvalidArgumentError(absl::StrCat("--planted: at most ", std::size(kPlants)));
  }
  echokv::model::DeviceOptions dev;
  dev.num_threads = 1;  // deterministic and cheap for a 260K model
  ECHOKV_ASSIGN_OR_RETURN(auto model, Transformer::Load(dir, dev));
  ECHOKV_ASSIGN_OR_RETURN(auto tok, echokv::model::LoadTokenizer(dir));
  if (hi > model->config().max_position_embeddings) {
    return absl::InvalidArgumentError("--max_tokens: exceeds the model's max_position_embeddings");
  }
  const int bos = model->config().bos_token_id;
  std::string out;

  for (int i = 0; i < absl::GetFlag(FLAGS_stories); ++i) {
    echokv::eval::EvalCase c;
    c.id = absl::StrFormat("story-%02d", i);
    if (bos >= 0) c.prompt_ids.push_back(bos);
    ECHOKV_RETURN_IF_ERROR(SampleTo(*model, &c.prompt_ids, TargetLength(i, lo, hi), i, false));
    ECHOKV_ASSIGN_OR_RETURN(std::string text, tok->Decode(c.prompt_ids, {true}));
    absl::StrAppend(&out, echokv::eval::CaseToJsonLine(c, {{"text", text}}), "\n");
  }

  for (int j = 0; j < planted; ++j) {
    const Plant& p = kPlants[j];
    echokv::eval::EvalCase c;
    c.id = absl::StrFormat("planted-%02d", j);
    ECHOKV_ASSIGN_OR_RETURN(c.prompt_ids, tok->Encode(p.intro));
    ECHOKV_ASSIGN_OR_RETURN(c.answer_ids, EncodeNoBos(*tok, p.name));
    ECHOKV_ASSIGN_OR_RETURN(std::vector<int> cue, EncodeNoBos(*tok, p.cue));
    // Evidence: every occurrence of the name's ids in the intro.
    const int intro_len = static_cast<int>(c.prompt_ids.size());
    for (int s = 0; s + static_cast<int>(c.answer_ids.size()) <= intro_len; ++s) {
      if (std::equal(c.answer_ids.begin(), c.answer_ids.end(), c.prompt_ids.begin() + s)) {
        c.evidence_spans.emplace_back(s, s + static_cast<int64_t>(c.answer_ids.size()));
      }
    }
    if (c.evidence_spans.empty()) {
      return absl::InternalError(absl::StrCat(c.id, ": the name's tokens do not appear in the intro"));
    }
    // Sample to the longest allowed length, then cut back to the last sentence end that
    // leaves room for the cue within the case's target length (>= lo + 40).
    const int target = TargetLength(planted + j * 7, lo + 40, hi);
    const int cue_len = static_cast<int>(cue.size());
    ECHOKV_RETURN_IF_ERROR(SampleTo(*model, &c.prompt_ids, hi - cue_len, 1000 + j, true));
    auto ends_sentence = [&](int n) {
      const std::string piece = tok->IdToPiece(c.prompt_ids[n - 1]);
      return piece.find_first_of(".!?") != std::string::npos;
    };
    int cut = target - cue_len;
    while (cut > lo - cue_len && !ends_sentence(cut)) --cut;
    if (cut <= lo - cue_len) {  // none in range below the target: look above it
      cut = target - cue_len;
      while (cut < hi - cue_len && !ends_sentence(cut)) ++cut;
      if (!ends_sentence(cut)) {
        return absl::InternalError(absl::StrCat(c.id, ": no sentence end between ", lo, " and ", hi, " tokens"));
      }
    }
    c.prompt_ids.resize(cut);
    c.prompt_ids.insert(c.prompt_ids.end(), cue.begin(), cue.end());
    if (static_cast<int>(c.prompt_ids.size()) < lo) {
      return absl::InternalError(absl::StrCat(c.id, ": only ", c.prompt_ids.size(),
                                              " tokens after cutting at a sentence end"));
    }
    ECHOKV_ASSIGN_OR_RETURN(std::string text, tok->Decode(c.prompt_ids, {true}));
    if (absl::GetFlag(FLAGS_preview)) {
      echokv::model::KvCache cache = model->NewCache();
      ECHOKV_ASSIGN_OR_RETURN(auto pre, model->Forward(c.prompt_ids, &cache));
      std::vector<int> gen;
      at::Tensor logits = pre.logits;
      for (int k = 0; k < 6; ++k) {
        at::Tensor l = logits.contiguous();
        gen.push_back(echokv::model::Argmax({l.data_ptr<float>(), static_cast<size_t>(l.numel())}));
        ECHOKV_ASSIGN_OR_RETURN(auto r, model->Decode(gen.back(), &cache));
        logits = r.logits;
      }
      ECHOKV_ASSIGN_OR_RETURN(std::string g, tok->Decode(gen));
      std::fprintf(stderr, "%s (%zu tokens) answer %s -> full greedy:%s\n", c.id.c_str(), c.prompt_ids.size(),
                   p.name, g.c_str());
    }
    absl::StrAppend(&out, echokv::eval::CaseToJsonLine(c, {{"text", text}}), "\n");
  }

  std::ofstream f(out_path, std::ios::binary);
  f << out;
  if (!f) return absl::InternalError(absl::StrCat("--out: cannot write ", out_path));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("echokv-make-eval-set --model DIR --out FILE.jsonl");
  absl::ParseCommandLine(argc, argv);
  echokv::InitLogging(argv[0]);
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "echokv-make-eval-set: error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
