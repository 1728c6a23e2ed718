#include "server/engine/persistence.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/report.h"
#include "kernels/kv_quant.h"
#include "model/ggml_types.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "server/state/fingerprint.h"

namespace echokv::server {
namespace {

absl::StatusOr<state::DType> StateDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return state::DType::kFloat32;
    case at::kBFloat16:
      return state::DType::kBFloat16;
    case at::kHalf:
      return state::DType::kFloat16;
    case at::kLong:
      return state::DType::kInt64;
    case at::kChar:
      return state::DType::kInt8;
    default:
      return absl::InternalError(absl::StrCat("no saved dtype for ", c10::toString(t)));
  }
}

absl::StatusOr<at::ScalarType> TorchDType(state::DType t) {
  switch (t) {
    case state::DType::kFloat32:
      return at::kFloat;
    case state::DType::kBFloat16:
      return at::kBFloat16;
    case state::DType::kFloat16:
      return at::kHalf;
    case state::DType::kInt64:
      return at::kLong;
    case state::DType::kInt8:
      return at::kChar;
    default:
      return absl::DataLossError(absl::StrCat("unexpected saved dtype ", state::DTypeName(t)));
  }
}

// Appends a blob viewing `t` (made contiguous on the CPU and kept alive by
// `rec`).
absl::Status AddBlob(TurnRecord *rec, std::string name, at::Tensor t) {
  t = t.to(at::kCPU).contiguous();
  ECHOKV_ASSIGN_OR_RETURN(state::DType dtype, StateDType(t.scalar_type()));
  state::BlobView b;
  b.name = std::move(name);
  b.dtype = dtype;
  b.shape = t.sizes().vec();
  b.data = absl::string_view(static_cast<const char *>(t.data_ptr()), t.numel() * t.element_size());
  rec->keep_alive.push_back(std::move(t));
  rec->segment.blobs.push_back(std::move(b));
  return absl::OkStatus();
}

// Reads a whole blob into a CPU tensor of its dtype and shape.
absl::StatusOr<at::Tensor> ReadTensor(const state::SessionReader &reader, const state::SessionReader::BlobRef &ref) {
  ECHOKV_ASSIGN_OR_RETURN(at::ScalarType dtype, TorchDType(ref.blob->dtype));
  at::Tensor t = at::empty(ref.blob->shape, at::TensorOptions().dtype(dtype));
  if (static_cast<uint64_t>(t.numel() * t.element_size()) != ref.blob->bytes) {
    return absl::DataLossError(
        absl::StrCat("blob ", ref.blob->name, ": ", ref.blob->bytes, " bytes do not match its shape"));
  }
  ECHOKV_RETURN_IF_ERROR(reader.Read(ref.segment, ref.blob->name, 0,
                                     absl::Span<char>(static_cast<char *>(t.data_ptr()), ref.blob->bytes)));
  return t;
}

absl::StatusOr<at::Tensor> ReadLatest(const state::SessionReader &reader, const std::string &name) {
  ECHOKV_ASSIGN_OR_RETURN(state::SessionReader::BlobRef ref, reader.FindLatest(name));
  return ReadTensor(reader, ref);
}

std::vector<std::vector<int64_t>> PerGroup(const at::Tensor &positions) {  // [G, n] int64
  at::Tensor p = positions.to(at::kCPU, at::kLong).contiguous();
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(p.size(0)));
  for (int64_t g = 0; g < p.size(0); ++g) {
    out[g].assign(p.data_ptr<int64_t>() + g * p.size(1), p.data_ptr<int64_t>() + (g + 1) * p.size(1));
  }
  return out;
}

// A [G, n] int64 positions blob whose groups each hold strictly increasing positions in
// [0, end) (kv_cells.h's invariant; `end` = the tokens the session holds), per group.
absl::StatusOr<std::vector<std::vector<int64_t>>> CheckedPositions(const at::Tensor &t, const std::string &name,
                                                                   int64_t groups, int64_t end) {
  if (t.scalar_type() != at::kLong || t.dim() != 2 || t.size(0) != groups) {
    return absl::DataLossError(absl::StrCat(name, ": expected int64 [", groups, ", n], got ", c10::toString(t.scalar_type()),
                                            " of rank ", t.dim()));
  }
  std::vector<std::vector<int64_t>> out = PerGroup(t);
  for (size_t g = 0; g < out.size(); ++g) {
    for (size_t i = 0; i < out[g].size(); ++i) {
      const int64_t p = out[g][i];
      if (p < 0 || p >= end) {
        return absl::DataLossError(absl::StrCat(name, ": group ", g, " holds position ", p, ", outside [0, ", end,
                                                ") (the tokens of the session)"));
      }
      if (i > 0 && p <= out[g][i - 1]) {
        return absl::DataLossError(
            absl::StrCat(name, ": group ", g, " positions are not strictly increasing at index ", i));
      }
    }
  }
  return out;
}

// `t` has shape `want` (-1: any size).
absl::Status CheckShape(const at::Tensor &t, const std::string &name, const std::vector<int64_t> &want) {
  bool ok = t.dim() == static_cast<int64_t>(want.size());
  for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || t.size(static_cast<int64_t>(i)) == want[i];
  if (ok) return absl::OkStatus();
  std::string expected = "[";
  for (size_t i = 0; i < want.size(); ++i) {
    absl::StrAppend(&expected, i > 0 ? ", " : "", want[i] < 0 ? std::string("n") : absl::StrCat(want[i]));
  }
  std::string got = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&got, i > 0 ? ", " : "", t.size(i));
  return absl::DataLossError(absl::StrCat(name, ": shape ", got, "] does not match the model's ", expected, "]"));
}

int64_t ModelElementSize(const model::Transformer &model) {
  const std::string &d = model.device_options().dtype;
  return d == "float32" ? 4 : 2;
}

template <typename Fn>
absl::Status Guard(const char *what, Fn fn) {
  try {
    return fn();
  } catch (const c10::Error &e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception &e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace

absl::StatusOr<state::ModelFingerprint> FingerprintModelDir(const std::string &dir) {
  if (model::IsGgufFile(dir)) {
    // A GGUF file: its metadata and tensor table (every byte before the data section)
    // stand for the config; then every tensor by name with its ggml type and bytes.
    ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> gguf, model::GgufFile::Open(dir));
    state::FingerprintBuilder b;
    ECHOKV_RETURN_IF_ERROR(b.AddConfig(gguf->header_bytes()));
    std::vector<const model::GgufTensor *> tensors;
    for (const model::GgufTensor &t : gguf->tensors()) tensors.push_back(&t);
    std::sort(tensors.begin(), tensors.end(),
              [](const model::GgufTensor *a, const model::GgufTensor *c) { return a->name < c->name; });
    for (const model::GgufTensor *t : tensors) {
      ECHOKV_RETURN_IF_ERROR(b.AddTensor(t->name, model::FindGgmlType(t->type)->name, t->dims, gguf->TensorBytes(*t)));
    }
    return b.Finish();
  }
  std::ifstream in(dir + "/config.json", std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("fingerprint: cannot read ", dir, "/config.json"));
  std::stringstream config;
  config << in.rdbuf();
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> ckpt, model::Checkpoint::Open(dir));
  state::FingerprintBuilder b;
  ECHOKV_RETURN_IF_ERROR(b.AddConfig(config.str()));
  for (const std::string &name : ckpt->Names()) {  // sorted
    const model::TensorView *t = ckpt->Find(name);
    ECHOKV_RETURN_IF_ERROR(b.AddTensor(name, model::DTypeName(t->dtype), t->shape,
                                       absl::string_view(reinterpret_cast<const char *>(t->data), t->nbytes)));
  }
  return b.Finish();
}

state::SavedSession ToStateMeta(const SessionInfo &meta, const SessionData &data) {
  state::SavedSession s;
  s.id = meta.id;
  s.tenant = meta.tenant;
  s.memory = meta.memory;
  nlohmann::json extra = nlohmann::json::object();
  extra["report"] = nlohmann::json::parse(compression::ReportToJson(meta.last_report));
  nlohmann::json messages = nlohmann::json::array();
  for (const model::ChatMessage &m : meta.messages) {
    nlohmann::json j = {{"role", m.role}, {"content", m.content}};
    if (!m.name.empty()) j["name"] = m.name;
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.tool_calls.empty()) {
      nlohmann::json calls = nlohmann::json::array();
      for (const model::ToolCall &c : m.tool_calls) {
        calls.push_back({{"id", c.id}, {"type", c.type}, {"name", c.name}, {"arguments", c.arguments_json}});
      }
      j["tool_calls"] = std::move(calls);
    }
    messages.push_back(std::move(j));
  }
  extra["messages"] = std::move(messages);
  if (!meta.tools_json.empty()) extra["tools"] = meta.tools_json;
  s.compression_config = std::move(extra);
  s.created = meta.created;
  s.last_used = meta.last_used;
  s.ttl = meta.ttl;
  s.tokens.assign(data.tokens.begin(), data.tokens.end());
  s.next_position = data.hot.next_position();
  return s;
}

absl::StatusOr<TurnRecord> EncodeTurn(const SessionInfo &meta, const SessionData &data, int64_t tokens_before,
                                      bool full) {
  TurnRecord rec;
  ECHOKV_RETURN_IF_ERROR(Guard("encoding the turn", [&]() -> absl::Status {
    rec.meta = ToStateMeta(meta, data);
    const int64_t total = static_cast<int64_t>(data.tokens.size());
    rec.segment.token_end = total;
    const int layers = data.hot.num_layers();
    if (data.cold != nullptr) {
      if (data.cold_len != total) {
        return absl::InternalError(absl::StrCat("cold tier holds ", data.cold_len, " tokens, the session ", total));
      }
      const int64_t begin = full ? 0 : tokens_before;
      rec.segment.token_begin = begin;
      rec.segment.supersedes_earlier = full;
      for (int l = 0; l < layers; ++l) {
        ECHOKV_RETURN_IF_ERROR(
            AddBlob(&rec, absl::StrCat("cold.k.", l), data.cold->keys(l).narrow(1, begin, total - begin)));
        ECHOKV_RETURN_IF_ERROR(
            AddBlob(&rec, absl::StrCat("cold.v.", l), data.cold->values(l).narrow(1, begin, total - begin)));
      }
      for (int l = 0; l < layers; ++l) {
        ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("hot.pos.", l), data.hot.positions(l)));
        if (l < static_cast<int>(data.window_queries.size()) && data.window_queries[l].defined()) {
          ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("win.q.", l), data.window_queries[l].to(at::kFloat)));
        }
        if (l < static_cast<int>(data.h2o_scores.size()) && data.h2o_scores[l].defined()) {
          ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("h2o.", l), data.h2o_scores[l].to(at::kFloat)));
        }
      }
      ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, "win.pos", at::tensor(data.window_positions, at::kLong)));
    } else {
      // Evict: the compact cache is the whole state; every turn supersedes.
      rec.segment.token_begin = 0;
      rec.segment.supersedes_earlier = true;
      for (int l = 0; l < layers; ++l) {
        if (data.hot.is_int8()) {
          // int8 rows and their float32 scales as held (issue 31): "hot.k8.<l>" etc., names
          // an older build does not know, so it refuses the session (DATA_LOSS naming
          // hot.k.<l>) instead of reading int8 as float32.
          ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("hot.k8.", l), data.hot.Int8Keys(l)));
          ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("hot.ks.", l), data.hot.KeyScales(l)));
          ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("hot.v8.", l), data.hot.Int8Values(l)));
          ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("hot.vs.", l), data.hot.ValueScales(l)));
        } else {
          ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("hot.k.", l), data.hot.keys(l)));
          ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("hot.v.", l), data.hot.values(l)));
        }
        ECHOKV_RETURN_IF_ERROR(AddBlob(&rec, absl::StrCat("hot.pos.", l), data.hot.positions(l)));
      }
    }
    return AddBlob(&rec, "logits", data.last_logits.to(at::kFloat));
  }));
  return rec;
}

absl::StatusOr<SessionInfo> MetaFromManifest(const state::SessionManifest &manifest, const model::Transformer &model) {
  const state::SavedSession &s = manifest.meta;
  SessionInfo m;
  m.id = s.id;
  m.tenant = s.tenant;
  m.memory = s.memory;
  const nlohmann::json &extra = s.compression_config;
  if (!extra.is_object() || !extra.contains("report")) {
    return absl::DataLossError(absl::StrCat("session ", s.id, ": saved metadata has no compression report"));
  }
  ECHOKV_ASSIGN_OR_RETURN(m.last_report, compression::ReportFromJson(extra["report"].dump()));
  m.config = m.last_report.config;
  try {
    if (extra.contains("messages") && extra["messages"].is_array()) {
      for (const auto &msg : extra["messages"]) {
        if (!msg.is_object() || !msg.contains("role") || !msg.contains("content") || !msg["role"].is_string() ||
            !msg["content"].is_string()) {
          return absl::DataLossError(absl::StrCat("session ", s.id, ": a saved chat message is malformed"));
        }
        model::ChatMessage cm{msg["role"].get<std::string>(), msg["content"].get<std::string>()};
        cm.name = msg.value("name", "");
        cm.tool_call_id = msg.value("tool_call_id", "");
        if (msg.contains("tool_calls") && msg["tool_calls"].is_array()) {
          for (const auto &c : msg["tool_calls"]) {
            if (!c.is_object())
              return absl::DataLossError(absl::StrCat("session ", s.id, ": a saved tool call is malformed"));
            cm.tool_calls.push_back(
                {c.value("id", ""), c.value("type", "function"), c.value("name", ""), c.value("arguments", "")});
          }
        }
        m.messages.push_back(std::move(cm));
      }
    }
    if (extra.contains("tools") && extra["tools"].is_string()) m.tools_json = extra["tools"].get<std::string>();
  } catch (const nlohmann::json::exception &e) {
    return absl::DataLossError(absl::StrCat("session ", s.id, ": saved chat messages are malformed: ", e.what()));
  }
  m.created = s.created;
  m.last_used = s.last_used;
  m.ttl = s.ttl;
  m.tokens_seen = static_cast<int64_t>(s.tokens.size());
  const model::ModelConfig &c = model.config();
  const int64_t entry_bytes = 2 * c.head_dim * ModelElementSize(model);  // K + V of one entry
  // The hot tier's own storage (issue 31): int8 rows count their scales.
  const int64_t hot_entry_bytes = m.config.cache_dtype == kernels::KvDtype::kInt8
                                      ? kernels::KvEntryBytes(kernels::KvDtype::kInt8, c.head_dim)
                                      : entry_bytes;
  // Hot entries from the newest hot.pos.<l> shapes ([G, n_l]).
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string name = absl::StrCat("hot.pos.", l);
    const state::BlobInfo *found = nullptr;
    for (const state::SegmentInfo &seg : manifest.segments) {
      if (const state::BlobInfo *b = seg.FindBlob(name)) found = b;
    }
    if (found == nullptr || found->shape.size() != 2 || found->shape[0] != c.num_kv_heads) {
      return absl::DataLossError(absl::StrCat("session ", s.id, ": ", name, " is missing or misshapen"));
    }
    m.retained_entries += found->shape[0] * found->shape[1];
  }
  m.retained_kv_bytes = m.retained_entries * hot_entry_bytes;
  m.full_kv_bytes = m.tokens_seen * c.num_layers * c.num_kv_heads * entry_bytes;
  m.cold_kv_bytes = m.memory == MemoryMode::kTiered ? m.full_kv_bytes : 0;
  m.cold_in_memory = false;
  return m;
}

absl::StatusOr<std::shared_ptr<SessionData>> LoadSessionData(const state::SessionReader &reader,
                                                             const model::Transformer &model) {
  auto data = std::make_shared<SessionData>();
  ECHOKV_RETURN_IF_ERROR(Guard("loading the session", [&]() -> absl::Status {
    const state::SessionManifest &m = reader.manifest();
    const model::ModelConfig &c = model.config();
    data->tokens.assign(m.meta.tokens.begin(), m.meta.tokens.end());
    const int64_t total = static_cast<int64_t>(data->tokens.size());
    // The hot tier's storage, from the saved report (absent before issue 31: float32).
    kernels::KvDtype hot_dtype = kernels::KvDtype::kFloat32;
    if (m.meta.compression_config.is_object() && m.meta.compression_config.contains("report")) {
      ECHOKV_ASSIGN_OR_RETURN(compression::CompressionReport saved,
                              compression::ReportFromJson(m.meta.compression_config["report"].dump()));
      hot_dtype = saved.config.cache_dtype;
    }
    if (m.meta.memory == state::MemoryMode::kTiered) {
      data->cold = std::make_shared<model::KvCache>(model.NewCache());
      for (int l = 0; l < c.num_layers; ++l) {
        const std::vector<state::SessionReader::BlobRef> ks = reader.FindAll(absl::StrCat("cold.k.", l));
        const std::vector<state::SessionReader::BlobRef> vs = reader.FindAll(absl::StrCat("cold.v.", l));
        if (ks.size() != vs.size())
          return absl::DataLossError(absl::StrCat("cold tier of layer ", l, " is incomplete"));
        for (size_t i = 0; i < ks.size(); ++i) {
          const state::SegmentInfo &seg = m.segments[ks[i].segment];
          ECHOKV_ASSIGN_OR_RETURN(at::Tensor k, ReadTensor(reader, ks[i]));
          ECHOKV_ASSIGN_OR_RETURN(at::Tensor v, ReadTensor(reader, vs[i]));
          const int64_t m_tokens = seg.token_end - seg.token_begin;
          ECHOKV_RETURN_IF_ERROR(CheckShape(k, absl::StrCat("cold.k.", l), {c.num_kv_heads, m_tokens, c.head_dim}));
          ECHOKV_RETURN_IF_ERROR(CheckShape(v, absl::StrCat("cold.v.", l), {c.num_kv_heads, m_tokens, c.head_dim}));
          std::vector<int64_t> positions;
          for (int64_t p = seg.token_begin; p < seg.token_end; ++p) positions.push_back(p);
          if (k.dim() != 3 || k.size(1) != static_cast<int64_t>(positions.size()) ||
              data->cold->size(l) != seg.token_begin) {
            return absl::DataLossError(absl::StrCat("cold tier of layer ", l, ": segment ", seg.seq,
                                                    " does not continue the tokens before it"));
          }
          ECHOKV_RETURN_IF_ERROR(data->cold->Append(l, k, v, positions));
        }
        if (data->cold->size(l) != total) {
          return absl::DataLossError(
              absl::StrCat("cold tier of layer ", l, " holds ", data->cold->size(l), " of ", total, " tokens"));
        }
      }
      data->cold->set_next_position(total);
      data->cold_len = total;
      ECHOKV_ASSIGN_OR_RETURN(at::Tensor wpos, ReadLatest(reader, "win.pos"));
      if (wpos.scalar_type() != at::kLong || wpos.dim() != 1) {
        return absl::DataLossError("win.pos: expected int64 [w]");
      }
      ECHOKV_RETURN_IF_ERROR(CheckedPositions(wpos.unsqueeze(0), "win.pos", 1, total).status());
      data->window_positions.assign(wpos.data_ptr<int64_t>(), wpos.data_ptr<int64_t>() + wpos.numel());
      const int64_t w = wpos.numel();
      std::vector<at::Tensor> kept;
      for (int l = 0; l < c.num_layers; ++l) {
        const std::string name = absl::StrCat("hot.pos.", l);
        ECHOKV_ASSIGN_OR_RETURN(at::Tensor pos, ReadLatest(reader, name));
        ECHOKV_RETURN_IF_ERROR(CheckedPositions(pos, name, c.num_kv_heads, total).status());
        kept.push_back(pos);  // indices into the cold tier == positions
        absl::StatusOr<at::Tensor> q = ReadLatest(reader, absl::StrCat("win.q.", l));
        if (q.ok()) ECHOKV_RETURN_IF_ERROR(CheckShape(*q, absl::StrCat("win.q.", l), {c.num_heads, w, c.head_dim}));
        data->window_queries.push_back(q.ok() ? *q : at::Tensor());
        absl::StatusOr<at::Tensor> h = ReadLatest(reader, absl::StrCat("h2o.", l));
        if (h.ok()) {
          ECHOKV_RETURN_IF_ERROR(CheckShape(*h, absl::StrCat("h2o.", l), {c.num_kv_heads, total}));
          data->h2o_scores.push_back(*h);
        }
      }
      if (!data->h2o_scores.empty() && static_cast<int>(data->h2o_scores.size()) != c.num_layers) {
        return absl::DataLossError("h2o scores are missing for some layers");
      }
      ECHOKV_ASSIGN_OR_RETURN(model::KvCache hot, model::KvCache::Gather(*data->cold, kept));
      // Re-quantizing the exact rows gives the bits the session held (per-token scales).
      ECHOKV_ASSIGN_OR_RETURN(data->hot, hot.ToStorage(hot_dtype));
    } else {
      // Every token the session holds went through the model: the next one is at `total`.
      if (m.meta.next_position != total) {
        return absl::DataLossError(absl::StrCat("next_position is ", m.meta.next_position, ", the session holds ",
                                                total, " tokens"));
      }
      const bool int8 = !reader.FindAll("hot.k8.0").empty();
      model::KvCache fresh = model.NewCache();
      if (int8) {
        ECHOKV_ASSIGN_OR_RETURN(data->hot, model::KvCache::WithStorage(c.num_layers, c.num_kv_heads, c.head_dim,
                                                                       fresh.options(), kernels::KvDtype::kInt8));
      } else {
        data->hot = std::move(fresh);
      }
      for (int l = 0; l < c.num_layers; ++l) {
        const std::string name = absl::StrCat("hot.pos.", l);
        if (int8) {
          ECHOKV_ASSIGN_OR_RETURN(at::Tensor k, ReadLatest(reader, absl::StrCat("hot.k8.", l)));
          ECHOKV_ASSIGN_OR_RETURN(at::Tensor ks, ReadLatest(reader, absl::StrCat("hot.ks.", l)));
          ECHOKV_ASSIGN_OR_RETURN(at::Tensor v, ReadLatest(reader, absl::StrCat("hot.v8.", l)));
          ECHOKV_ASSIGN_OR_RETURN(at::Tensor vs, ReadLatest(reader, absl::StrCat("hot.vs.", l)));
          ECHOKV_ASSIGN_OR_RETURN(at::Tensor pos, ReadLatest(reader, name));
          ECHOKV_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> groups,
                                  CheckedPositions(pos, name, c.num_kv_heads, total));
          absl::Status set = data->hot.SetLayerInt8(l, k, ks, v, vs, std::move(groups));
          if (!set.ok()) return absl::DataLossError(absl::StrCat("hot tier of layer ", l, ": ", set.message()));
          continue;
        }
        ECHOKV_ASSIGN_OR_RETURN(at::Tensor k, ReadLatest(reader, absl::StrCat("hot.k.", l)));
        ECHOKV_ASSIGN_OR_RETURN(at::Tensor v, ReadLatest(reader, absl::StrCat("hot.v.", l)));
        ECHOKV_ASSIGN_OR_RETURN(at::Tensor pos, ReadLatest(reader, name));
        ECHOKV_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> groups,
                                CheckedPositions(pos, name, c.num_kv_heads, total));
        const int64_t n = pos.size(1);
        ECHOKV_RETURN_IF_ERROR(CheckShape(k, absl::StrCat("hot.k.", l), {c.num_kv_heads, n, c.head_dim}));
        ECHOKV_RETURN_IF_ERROR(CheckShape(v, absl::StrCat("hot.v.", l), {c.num_kv_heads, n, c.head_dim}));
        ECHOKV_RETURN_IF_ERROR(data->hot.SetLayer(l, k, v, std::move(groups)));
      }
      data->hot.set_next_position(m.meta.next_position);
      // A float32 file of an int8 session (none is written so) or the reverse: the
      // session's storage wins.
      ECHOKV_ASSIGN_OR_RETURN(data->hot, data->hot.ToStorage(hot_dtype));
    }
    ECHOKV_ASSIGN_OR_RETURN(at::Tensor logits, ReadLatest(reader, "logits"));
    if (logits.dim() != 1 || logits.size(0) != c.vocab_size) {
      return absl::DataLossError("saved logits do not match the model's vocabulary");
    }
    data->last_logits = logits;
    return absl::OkStatus();
  }));
  return data;
}

}  // namespace echokv::server
