// libFuzzer target: the model directory's files as a hostile checkpoint would hold them.
//   selector % 3 == 0: model.safetensors (header JSON, dtypes, shapes, data offsets)
//   selector % 3 == 1: model.safetensors.index.json, NUL, its one shard
//                      model-00001-of-00001.safetensors (the sharded index path)
//   selector % 3 == 2: config.json, NUL, generation_config.json (model/config.cc)
// Files go to a private directory under /dev/shm (tmpfs) because the readers mmap them.
#include <dirent.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "model/config.h"
#include "model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const std::string& Dir() {
  static const std::string* dir = [] {
    char tmpl[] = "/dev/shm/echokv-fuzz-model-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      char fallback[] = "/tmp/echokv-fuzz-model-XXXXXX";
      if (mkdtemp(fallback) == nullptr) std::abort();
      return new std::string(fallback);
    }
    return new std::string(tmpl);
  }();
  return *dir;
}

void Write(const std::string& name, absl::string_view bytes) {
  std::ofstream out(Dir() + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void ClearDir() {
  for (const char* name : {"model.safetensors", "model.safetensors.index.json", "model-00001-of-00001.safetensors"}) {
    unlink((Dir() + "/" + name).c_str());
  }
}

// Touches every byte each view claims, so a view past its mapping is an ASan/SEGV report.
uint64_t Touch(const echokv::model::Checkpoint& ckpt) {
  uint64_t sum = 0;
  for (const std::string& name : ckpt.Names()) {
    const echokv::model::TensorView* v = ckpt.Find(name);
    if (v == nullptr) echokv::fuzz::Violation("Names() lists " + name + " but Find does not");
    uint64_t elements = 1;
    for (int64_t d : v->shape) {
      if (d < 0) echokv::fuzz::Violation("negative dimension accepted");
      elements *= static_cast<uint64_t>(d);
    }
    if (elements * echokv::model::DTypeSize(v->dtype) != v->nbytes) {
      echokv::fuzz::Violation("nbytes disagrees with shape x dtype for " + name);
    }
    for (size_t i = 0; i < v->nbytes; ++i) sum += v->data[i];
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const echokv::fuzz::Selected in = echokv::fuzz::Select(data, size);
  if (size == 0) return 0;
  switch (in.selector % 3) {
    case 0:
    case 1: {
      ClearDir();
      if (in.selector % 3 == 0) {
        Write("model.safetensors", in.rest);
      } else {
        auto [index, shard] = echokv::fuzz::SplitAtNul(in.rest);
        Write("model.safetensors.index.json", index);
        Write("model-00001-of-00001.safetensors", shard);
      }
      auto ckpt = echokv::model::Checkpoint::Open(Dir());
      if (ckpt.ok()) {
        volatile uint64_t sink = Touch(**ckpt);
        (void)sink;
      }
      break;
    }
    case 2: {
      auto [config, generation] = echokv::fuzz::SplitAtNul(in.rest);
      auto cfg = echokv::model::ParseModelConfig(config, generation);
      if (cfg.ok()) {
        // A config the loader accepts must describe a buildable model.
        if (cfg->num_layers <= 0 || cfg->hidden_size <= 0 || cfg->num_heads <= 0 || cfg->num_kv_heads <= 0 ||
            cfg->head_dim <= 0 || cfg->vocab_size <= 0 || cfg->num_heads % cfg->num_kv_heads != 0) {
          echokv::fuzz::Violation("ParseModelConfig accepted impossible dimensions");
        }
      }
      break;
    }
  }
  return 0;
}
