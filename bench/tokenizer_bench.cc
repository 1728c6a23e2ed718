// Encode throughput of the byte-level BPE tokenizer on generated English prose, code and
// CJK text (deterministic, ~2 MB each), plus the 1 MB pathological inputs.
//
//   echokv-bench-tokenizer [TOKENIZER_DIR]   # default $ECHOKV_TEST_DATA/tokenizers/qwen2.5
//
// Prints one line per input: bytes, ids, bytes per id, best and median of 5 runs in MB/s
// (1 MB = 1e6 bytes). Single-threaded.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/env.h"
#include "model/bpe_tokenizer.h"

namespace {

constexpr size_t kTargetBytes = 2000000;

std::string Prose(std::mt19937* rng) {
  static const char* const kWords[] = {
      "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
      "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which", "but",
      "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
      "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "time",
      "people", "year", "way", "day", "man", "thing", "woman", "life", "child", "world",
      "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
      "place", "case", "week", "company", "system", "program", "question", "work", "government",
      "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
      "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business",
      "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour",
      "game", "line", "end", "member", "law", "car", "city", "community", "name", "president",
      "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face",
      "others", "level", "office", "door", "health", "person", "art", "war", "history", "party",
      "result", "change", "morning", "reason", "research", "girl", "guy", "moment", "air",
      "teacher", "force", "education", "remarkable", "understanding", "nevertheless",
      "compression", "attention", "memory", "quickly", "beautiful", "interesting", "1984",
      "2024", "3.5", "don't", "it's", "we'll", "they've"};
  std::string out;
  while (out.size() < kTargetBytes) {
    const int words = 6 + static_cast<int>((*rng)() % 18);
    for (int w = 0; w < words; ++w) {
      std::string word = kWords[(*rng)() % (sizeof(kWords) / sizeof(kWords[0]))];
      if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      out += word;
      if (w + 1 < words) out += ((*rng)() % 9 == 0) ? ", " : " ";
    }
    out += ((*rng)() % 7 == 0) ? "?" : ".";
    out += ((*rng)() % 6 == 0) ? "\n\n" : " ";
  }
  return out;
}

std::string Code(std::mt19937* rng) {
  static const char* const kNames[] = {"count", "buffer", "index", "value", "result", "node",
                                       "tensor", "cache", "key", "layer", "offset", "size"};
  const auto name = [&] { return std::string(kNames[(*rng)() % 12]); };
  std::string out;
  int fn = 0;
  while (out.size() < kTargetBytes) {
    if ((*rng)() % 2 == 0) {
      out += "def " + name() + "_" + std::to_string(fn++) + "(" + name() + ", " + name() + "=None):\n";
      out += "    \"\"\"Returns the " + name() + " of the " + name() + ".\"\"\"\n";
      out += "    for i in range(" + std::to_string((*rng)() % 1000) + "):\n";
      out += "        if " + name() + "[i] > " + std::to_string((*rng)() % 100) + ":\n";
      out += "            " + name() + " += " + name() + "[i] * 0." + std::to_string((*rng)() % 99) + "\n";
      out += "    return {'" + name() + "': " + name() + ", \"n\": len(" + name() + ")}\n\n";
    } else {
      out += "static int64_t " + name() + "_" + std::to_string(fn++) + "(const std::vector<float>& " +
             name() + ", int " + name() + ") {\n";
      out += "  int64_t " + name() + " = 0;  // accumulate\n";
      out += "  for (size_t i = 0; i < " + name() + ".size(); ++i) {\n";
      out += "    " + name() + " += static_cast<int64_t>(" + name() + "[i]) << " +
             std::to_string((*rng)() % 16) + ";\n";
      out += "  }\n  return " + name() + " != 0 ? " + name() + " : -1;\n}\n\n";
    }
  }
  return out;
}

std::string Cjk(std::mt19937* rng) {
  // Common Chinese characters (UTF-8) and full-width punctuation.
  static const char kChars[] =
      "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对"
      "可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同"
      "三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定"
      "女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化"
      "由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应"
      "路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许";
  static const char* const kPunct[] = {"，", "。", "！", "？", "、", "："};
  const size_t n_chars = (sizeof(kChars) - 1) / 3;
  std::string out;
  while (out.size() < kTargetBytes) {
    const int len = 4 + static_cast<int>((*rng)() % 20);
    for (int i = 0; i < len; ++i) out.append(kChars + 3 * ((*rng)() % n_chars), 3);
    out += kPunct[(*rng)() % 6];
    if ((*rng)() % 10 == 0) out += "\n";
  }
  return out;
}

void Run(const echokv::model::Tokenizer& tok, const char* label, const std::string& text, int runs) {
  std::vector<double> secs;
  size_t n_ids = 0;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto ids = tok.Encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ids.ok()) {
      std::fprintf(stderr, "%s: %s\n", label, ids.status().ToString().c_str());
      std::exit(1);
    }
    n_ids = ids->size();
    secs.push_back(s);
  }
  std::sort(secs.begin(), secs.end());
  const double mb = text.size() / 1e6;
  std::printf("%-22s %9zu bytes %8zu ids %5.2f B/id  best %7.2f MB/s  median %7.2f MB/s  (%.3f s)\n",
              label, text.size(), n_ids, static_cast<double>(text.size()) / std::max<size_t>(n_ids, 1),
              mb / secs.front(), mb / secs[secs.size() / 2], secs[secs.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (argc > 1) {
    dir = argv[1];
  } else if (auto data = echokv::GetEnv("ECHOKV_TEST_DATA")) {
    dir = *data + "/tokenizers/qwen2.5";
  } else {
    std::fprintf(stderr, "usage: echokv-bench-tokenizer TOKENIZER_DIR (or set ECHOKV_TEST_DATA)\n");
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = echokv::model::LoadBpeTokenizer(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::printf("tokenizer %s loaded in %.3f s\n", dir.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::mt19937 rng(20240601);
  Run(**tok, "english prose", Prose(&rng), 5);
  Run(**tok, "code (python + c++)", Code(&rng), 5);
  Run(**tok, "cjk (chinese)", Cjk(&rng), 5);
  Run(**tok, "1 MB 'a'", std::string(1000000, 'a'), 3);
  Run(**tok, "1 MB '^'", std::string(1000000, '^'), 3);
  Run(**tok, "1 MB ' '", std::string(1000000, ' '), 3);
  return 0;
}
