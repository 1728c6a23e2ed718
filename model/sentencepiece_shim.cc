// The SentencePiece module (libechokv_spm_shim.so): a small C API over Debian's
// libsentencepiece, loaded at run time by model/sentencepiece_tokenizer.cc with
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a module: libsentencepiece.so.0 bundles and exports its own protobuf-lite 3.14,
// while LibTorch and gRPC load the system libprotobuf; linked into one process the two
// runtimes crash at start-up. Loaded locally with deep binding, SentencePiece binds to
// its own protobuf and nothing else sees it.
//
// Rules for this file: include only SentencePiece and std headers (sentencepiece's
// header defines `namespace absl { using std::string_view; }`, which clashes with the
// real Abseil), let no C++ exception cross the C boundary, and report errors as
// strings allocated here and released with echokv_spm_free().
//
//   char* err = nullptr;
//   EchokvSpm* spm = echokv_spm_load("/models/x/tokenizer.model", &err);
//   int* ids; size_t n;
//   if ((err = echokv_spm_encode(spm, "Hello", 5, &ids, &n)) == nullptr) echokv_spm_free(ids);

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

// Exported by libsentencepiece.so.0 but declared in no public header.
namespace sentencepiece {
namespace logging {
void SetMinLogLevel(int v);
}  // namespace logging
}  // namespace sentencepiece

namespace {

// SentencePiece logs through std::cerr. Under RTLD_DEEPBIND its code binds to
// libstdc++'s own std::cerr object, which is never constructed when the executable
// holds a copy-relocated std::cerr (the usual case): any log line would crash. So
// logging stays at FATAL only (level 3; FATAL aborts the process anyway), set when the
// module loads and again before training, whose arguments must not lower it.
constexpr int kQuietLogLevel = 3;

__attribute__((constructor)) void QuietSentencePiece() {
  sentencepiece::logging::SetMinLogLevel(kQuietLogLevel);
}

// `args` without any --minloglevel flag (see kQuietLogLevel).
std::string WithoutLogLevel(const std::string& args) {
  std::string out;
  size_t i = 0;
  while (i < args.size()) {
    size_t start = args.find_first_not_of(" \t\n", i);
    if (start == std::string::npos) break;
    size_t end = args.find_first_of(" \t\n", start);
    if (end == std::string::npos) end = args.size();
    const std::string token = args.substr(start, end - start);
    if (token.rfind("--minloglevel", 0) != 0 && token.rfind("-minloglevel", 0) != 0) {
      if (!out.empty()) out += ' ';
      out += token;
    }
    i = end;
  }
  return out;
}

// Copies `s` into a malloc'ed NUL-terminated buffer (nullptr when out of memory).
char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

char* StatusError(const sentencepiece::util::Status& status) {
  return CopyString(std::string("sentencepiece: ") + status.ToString());
}

char* ExceptionError(const char* what) {
  return CopyString(std::string("sentencepiece: unexpected exception: ") + what);
}

}  // namespace

// One loaded model.
struct EchokvSpm {
  sentencepiece::SentencePieceProcessor processor;
};

extern "C" {

// The version of this C API; the loader refuses a module with another value.
__attribute__((visibility("default"))) int echokv_spm_abi_version() { return 1; }

// Releases any buffer or error string this module returned.
__attribute__((visibility("default"))) void echokv_spm_free(void* p) { std::free(p); }

// Loads a tokenizer.model; nullptr with *error set on failure.
__attribute__((visibility("default"))) EchokvSpm* echokv_spm_load(const char* path, char** error) {
  *error = nullptr;
  try {
    auto spm = std::make_unique<EchokvSpm>();
    sentencepiece::util::Status status = spm->processor.Load(std::string(path));
    if (!status.ok()) {
      *error = StatusError(status);
      return nullptr;
    }
    return spm.release();
  } catch (const std::exception& e) {
    *error = ExceptionError(e.what());
  } catch (...) {
    *error = ExceptionError("unknown");
  }
  return nullptr;
}

__attribute__((visibility("default"))) void echokv_spm_destroy(EchokvSpm* spm) { delete spm; }

__attribute__((visibility("default"))) int echokv_spm_piece_size(const EchokvSpm* spm) {
  return spm->processor.GetPieceSize();
}
__attribute__((visibility("default"))) int echokv_spm_bos_id(const EchokvSpm* spm) {
  return spm->processor.bos_id();
}
__attribute__((visibility("default"))) int echokv_spm_eos_id(const EchokvSpm* spm) {
  return spm->processor.eos_id();
}
__attribute__((visibility("default"))) int echokv_spm_unk_id(const EchokvSpm* spm) {
  return spm->processor.unk_id();
}

// The id of `piece` (length `len`), or the unknown id when it is not in the vocabulary.
__attribute__((visibility("default"))) int echokv_spm_piece_to_id(const EchokvSpm* spm,
                                                                  const char* piece, size_t len) {
  try {
    return spm->processor.PieceToId(std::string(piece, len));
  } catch (...) {
    return spm->processor.unk_id();
  }
}

// The piece of `id` in [0, piece_size); its bytes stay valid while `spm` lives.
// nullptr (and *len = 0) when out of range.
__attribute__((visibility("default"))) const char* echokv_spm_id_to_piece(const EchokvSpm* spm,
                                                                         int id, size_t* len) {
  *len = 0;
  if (id < 0 || id >= spm->processor.GetPieceSize()) return nullptr;
  const std::string& piece = spm->processor.IdToPiece(id);
  *len = piece.size();
  return piece.data();
}

// Token kinds of an id in [0, piece_size) (false when out of range).
__attribute__((visibility("default"))) int echokv_spm_is_control(const EchokvSpm* spm, int id) {
  if (id < 0 || id >= spm->processor.GetPieceSize()) return 0;
  return spm->processor.IsControl(id) ? 1 : 0;
}
__attribute__((visibility("default"))) int echokv_spm_is_unknown(const EchokvSpm* spm, int id) {
  if (id < 0 || id >= spm->processor.GetPieceSize()) return 0;
  return spm->processor.IsUnknown(id) ? 1 : 0;
}
__attribute__((visibility("default"))) int echokv_spm_is_byte(const EchokvSpm* spm, int id) {
  if (id < 0 || id >= spm->processor.GetPieceSize()) return 0;
  return spm->processor.IsByte(id) ? 1 : 0;
}

// Encodes `len` bytes of `text` to ids (no BOS/EOS). On success returns nullptr and
// sets *ids (malloc'ed, free with echokv_spm_free; nullptr when empty) and *n.
__attribute__((visibility("default"))) char* echokv_spm_encode(const EchokvSpm* spm,
                                                              const char* text, size_t len,
                                                              int** ids, size_t* n) {
  *ids = nullptr;
  *n = 0;
  try {
    std::vector<int> out;
    sentencepiece::util::Status status =
        spm->processor.Encode(std::string(text, len), &out);
    if (!status.ok()) return StatusError(status);
    if (out.empty()) return nullptr;
    int* buffer = static_cast<int*>(std::malloc(out.size() * sizeof(int)));
    if (buffer == nullptr) return CopyString("sentencepiece: out of memory");
    std::memcpy(buffer, out.data(), out.size() * sizeof(int));
    *ids = buffer;
    *n = out.size();
    return nullptr;
  } catch (const std::exception& e) {
    return ExceptionError(e.what());
  } catch (...) {
    return ExceptionError("unknown");
  }
}

// Decodes `n` ids (each in [0, piece_size): the caller checks) to text. On success
// returns nullptr and sets *text (malloc'ed, NUL-terminated) and *text_len.
__attribute__((visibility("default"))) char* echokv_spm_decode(const EchokvSpm* spm,
                                                              const int* ids, size_t n,
                                                              char** text, size_t* text_len) {
  *text = nullptr;
  *text_len = 0;
  try {
    std::vector<int> in(ids, ids + n);
    std::string out;
    sentencepiece::util::Status status = spm->processor.Decode(in, &out);
    if (!status.ok()) return StatusError(status);
    char* buffer = CopyString(out);
    if (buffer == nullptr) return CopyString("sentencepiece: out of memory");
    *text = buffer;
    *text_len = out.size();
    return nullptr;
  } catch (const std::exception& e) {
    return ExceptionError(e.what());
  } catch (...) {
    return ExceptionError("unknown");
  }
}

// Trains a model; `args` in spm_train flag syntax ("--input=x --model_prefix=y ...",
// whitespace-separated; --minloglevel is ignored). Returns nullptr on success.
__attribute__((visibility("default"))) char* echokv_spm_train(const char* args) {
  try {
    sentencepiece::logging::SetMinLogLevel(kQuietLogLevel);
    sentencepiece::util::Status status =
        sentencepiece::SentencePieceTrainer::Train(WithoutLogLevel(args));
    sentencepiece::logging::SetMinLogLevel(kQuietLogLevel);
    if (!status.ok()) return StatusError(status);
    return nullptr;
  } catch (const std::exception& e) {
    return ExceptionError(e.what());
  } catch (...) {
    return ExceptionError("unknown");
  }
}

}  // extern "C"
