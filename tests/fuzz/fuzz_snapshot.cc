// libFuzzer target: a session snapshot as ImportSession receives it (client bytes), then
// what the engine does with an accepted one (engine.cc SessionImportImpl::Complete):
// SnapshotImporter::Feed in chunks (server/state/snapshot.cc, the manifest and segment
// formats of format.cc), MetaFromManifest on the parsed manifest (server/engine/persistence.cc:
// the saved report, chat messages and blob shapes), Finish, then OpenSession +
// LoadSessionData (blobs to tensors against the real stories260K model), and delete.
// The fuzz build accepts any checksum (state/format.h ChecksumMatches) so mutations reach
// the parsers; the model fingerprint still has to match, as the seeds' does.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "model/transformer.h"
#include "server/engine/persistence.h"
#include "server/state/snapshot.h"
#include "server/state/store.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

struct World {
  std::unique_ptr<echokv::model::Transformer> model;
  std::unique_ptr<echokv::state::StateStore> store;
};

World& GetWorld() {
  static World* w = [] {
    auto* world = new World();
    const std::string dir = std::string(ECHOKV_FUZZ_SOURCE_DIR) + "/models/stories260K";
    echokv::model::DeviceOptions device;
    device.num_threads = 1;
    auto model = echokv::model::Transformer::Load(dir, device);
    if (!model.ok()) {
      std::fprintf(stderr, "fuzz_snapshot: %s\n", model.status().ToString().c_str());
      std::abort();
    }
    world->model = std::move(*model);
    auto fp = echokv::server::FingerprintModelDir(dir);
    if (!fp.ok()) std::abort();
    char tmpl[] = "/dev/shm/echokv-fuzz-state-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) std::abort();
    echokv::state::StoreOptions options;
    options.dir = tmpl;
    options.model = *fp;
    options.fsync = echokv::state::FsyncPolicy::kNone;
    auto store = echokv::state::StateStore::Create(options);
    if (!store.ok()) {
      std::fprintf(stderr, "fuzz_snapshot: %s\n", store.status().ToString().c_str());
      std::abort();
    }
    world->store = std::move(*store);
    return world;
  }();
  return *w;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  GetWorld();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = GetWorld();
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto importer = w.store->BeginImport();
  // Chunks as a client would send them; odd sizes cross every part boundary somewhere.
  const size_t chunk = size > 0 ? 1 + data[size - 1] % 97 * 61 : 1;
  for (size_t off = 0; off < size; off += chunk) {
    if (!importer->Feed(bytes.substr(off, chunk)).ok()) return 0;
  }
  const echokv::state::SessionManifest* parsed = importer->manifest();
  if (parsed == nullptr) {
    (void)importer->Finish();
    return 0;
  }
  if (!echokv::server::MetaFromManifest(*parsed, *w.model).ok()) return 0;
  auto committed = importer->Finish();
  importer.reset();
  if (!committed.ok()) return 0;
  const std::string id = committed->meta.id;
  {
    auto reader = w.store->OpenSession(id);
    if (reader.ok()) {
      (void)echokv::server::MetaFromManifest((*reader)->manifest(), *w.model);
      (void)echokv::server::LoadSessionData(**reader, *w.model);
    }
  }
  if (!w.store->DeleteSession(id).ok()) echokv::fuzz::Violation("cannot delete the session just imported");
  return 0;
}
