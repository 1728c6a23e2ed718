// Engine helpers: TTL and request-size checks, tokenization of plain and chat input
// (engine_impl.h), session info.
#include "server/engine/engine_impl.h"

namespace echokv::server {

absl::Status Engine::Impl::CheckTtl(const std::optional<absl::Duration>& ttl) const {
  if (!ttl.has_value()) return absl::OkStatus();
  if (*ttl <= absl::ZeroDuration() || *ttl > config.limits.max_session_ttl) {
    return MakeError(ErrorKind::kInvalidArgument, "ttl_seconds",
                     absl::StrCat("ttl_seconds must be in [1, ", absl::ToInt64Seconds(config.limits.max_session_ttl),
                                  "] (max_session_ttl), got ", absl::ToInt64Seconds(*ttl)));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::CheckSessionSettings(const std::optional<absl::Duration>& ttl,
                                                const compression::CompressionConfig& config) const {
  ECHOKV_RETURN_IF_ERROR(CheckTtl(ttl));
  ECHOKV_RETURN_IF_ERROR(WithFieldPrefix(config.Validate(), "compression.", "compression"));
  if (config.cache_dtype == kernels::KvDtype::kInt8 && !int8_cache_ok) {
    return MakeError(ErrorKind::kInvalidArgument, "compression.cache_dtype",
                     "compression.cache_dtype int8 needs the CPU float32 model; this server runs on another device "
                     "or dtype (use float32)");
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::CheckTokenIds(absl::Span<const int> ids, absl::string_view field) const {
  const int v = facts.vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= v) {
      return MakeError(ErrorKind::kInvalidArgument, field,
                       absl::StrCat(field, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ", v, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::CheckImport(const state::SavedSession& saved, const SessionInfo& incoming,
                                       const std::optional<absl::Duration>& ttl) const {
  // A ttl in the header replaces the saved one (and is the client's own field).
  ECHOKV_RETURN_IF_ERROR(CheckTtl(ttl));
  auto snapshot = [](const absl::Status& s) { return WithFieldPrefix(s, "snapshot: ", "snapshot"); };
  if (absl::Status s = CheckSessionSettings(ttl.has_value() ? ttl : std::optional<absl::Duration>(saved.ttl),
                                            incoming.config);
      !s.ok()) {
    return snapshot(s);
  }
  if (saved.tokens.empty()) return MakeError(ErrorKind::kInvalidArgument, "snapshot.tokens", "snapshot: tokens: empty");
  if (absl::Status s = CheckTokenIds(saved.tokens, "tokens"); !s.ok()) return snapshot(s);
  const int64_t n = static_cast<int64_t>(saved.tokens.size());
  if (n > facts.limits.max_context_tokens) {
    return MakeError(ErrorKind::kContextLengthExceeded, "snapshot.tokens",
                     absl::StrCat("snapshot: tokens: ", n, " tokens exceed max_context_tokens (",
                                  facts.limits.max_context_tokens, ")"));
  }
  return absl::OkStatus();
}

SessionInfo Engine::Impl::MetaFor(const SessionData& data, const compression::CompressionReport& report,
                                  MemoryMode memory) const {
  SessionInfo m;
  m.memory = memory;
  m.config = report.config;
  m.last_report = report;
  m.tokens_seen = static_cast<int64_t>(data.tokens.size());
  m.retained_entries = data.hot.cells().TotalEntries();
  m.retained_kv_bytes = data.hot.KvBytes();
  m.full_kv_bytes = data.hot.FullEquivalentKvBytes(m.tokens_seen);
  if (data.cold != nullptr) {
    m.cold_kv_bytes = data.cold->FullEquivalentKvBytes(data.cold_len);
    m.cold_in_memory = true;
  }
  return m;
}

std::vector<LayerCacheInfo> Engine::Impl::Layers(const model::KvCells& cells, bool positions,
                                                 const compression::CompressionReport* report,
                                                 kernels::KvDtype dtype) const {
  const int64_t row = dtype == kernels::KvDtype::kInt8
                          ? kernels::KvEntryBytes(dtype, facts.head_dim)
                          : bytes_per_token / std::max(1, facts.num_layers * facts.num_kv_heads);
  std::vector<LayerCacheInfo> out;
  for (int l = 0; l < cells.num_layers(); ++l) {
    LayerCacheInfo layer;
    layer.retained = cells.size(l);
    for (int g = 0; g < cells.num_kv_heads(); ++g) {
      GroupCache gc;
      gc.retained = static_cast<int64_t>(cells.positions(l, g).size());
      if (positions) gc.positions = cells.positions(l, g);
      gc.kv_bytes = gc.retained * row;
      const size_t at = static_cast<size_t>(l) * cells.num_kv_heads() + g;
      if (report != nullptr && report->retained_mass.size() == static_cast<size_t>(cells.num_layers()) *
                                                                  static_cast<size_t>(cells.num_kv_heads())) {
        gc.retained_mass = report->retained_mass[at];
      }
      layer.kv_bytes += gc.kv_bytes;
      layer.groups.push_back(std::move(gc));
    }
    out.push_back(std::move(layer));
  }
  return out;
}

std::function<void(const std::string&, int64_t, int64_t)> Engine::Impl::ProgressAdapter(ProgressFn progress,
                                                                                        absl::Time admitted) const {
  if (!progress) return nullptr;
  const Clock* c = clock;
  return [progress, admitted, c](const std::string& phase, int64_t done, int64_t total) {
    progress(ProgressEvent{phase, done, total, absl::ToDoubleSeconds(c->Now() - admitted)});
  };
}

absl::Status Engine::Impl::CheckRequestBytes(const InputSpec& input) const {
  int64_t bytes = static_cast<int64_t>(input.text.size() + input.tools_json.size()) +
                  static_cast<int64_t>(input.tokens.size()) * 4;
  for (const auto& m : input.chat) {
    bytes += static_cast<int64_t>(m.content.size() + m.role.size() + m.name.size() + m.tool_call_id.size());
    for (const auto& c : m.tool_calls) bytes += static_cast<int64_t>(c.id.size() + c.name.size() + c.arguments_json.size());
  }
  if (bytes > config.limits.max_request_bytes) {
    return MakeError(ErrorKind::kInvalidArgument, "input",
                     absl::StrCat("input: ", bytes, " bytes exceed max_request_bytes (",
                                  config.limits.max_request_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> Engine::Impl::Tokenize(const InputSpec& input, bool default_special,
                                                       int64_t max_tokens, int64_t held) const {
  ECHOKV_RETURN_IF_ERROR(CheckRequestBytes(input));
  const int64_t max_ctx = facts.limits.max_context_tokens;
  auto too_long = [&](int64_t n, bool at_least) {
    return MakeError(ErrorKind::kContextLengthExceeded, "input",
                     absl::StrCat("input: ", at_least ? "at least " : "", n, " tokens",
                                  held > 0 ? absl::StrCat(" + ", held, " in the session") : "",
                                  " exceed max_context_tokens (", max_ctx, ")"));
  };
  std::vector<int> ids;
  switch (input.kind) {
    case InputSpec::Kind::kNone:
      return MakeError(ErrorKind::kInvalidArgument, "input", "input: one of text, tokens or chat is required");
    case InputSpec::Kind::kText: {
      if (input.text.empty()) return MakeError(ErrorKind::kInvalidArgument, "input.text", "input.text: empty");
      model::EncodeOptions eo;
      eo.add_special_tokens = input.add_special_tokens.value_or(default_special);
      eo.parse_special = false;  // user text: special-token strings stay plain text
      // Bounded work: tokenization stops as soon as the text cannot fit (#12).
      ECHOKV_ASSIGN_OR_RETURN(model::BoundedEncoding enc, tokenizer->EncodeAtMost(input.text, eo, max_tokens));
      if (enc.exceeded) return too_long(enc.at_least, true);
      ids = std::move(enc.ids);
      break;
    }
    case InputSpec::Kind::kTokens: {
      if (input.tokens.empty()) return MakeError(ErrorKind::kInvalidArgument, "input.tokens", "input.tokens: empty");
      ECHOKV_RETURN_IF_ERROR(CheckTokenIds(input.tokens, "input.tokens.ids"));
      ids = input.tokens;
      break;
    }
    case InputSpec::Kind::kChat: {
      if (input.chat.empty()) return MakeError(ErrorKind::kInvalidArgument, "input.chat", "input.chat: no messages");
      if (!chat.has_value()) {
        return MakeError(ErrorKind::kUnimplemented, "input.chat",
                         absl::StrCat("input.chat: this model has no usable chat template (", chat_error,
                                      "); send text or tokens instead"));
      }
      absl::StatusOr<ChatEncoding> r = EncodeConversation({}, input.chat, input.tools_json, input.add_generation_prompt);
      if (!r.ok()) return r.status();
      ids = std::move(r->full);
      break;
    }
  }
  if (ids.empty()) return MakeError(ErrorKind::kInvalidArgument, "input", "input: no tokens after tokenization");
  if (static_cast<int64_t>(ids.size()) > max_tokens) return too_long(static_cast<int64_t>(ids.size()), false);
  return ids;
}

absl::StatusOr<Engine::Impl::ChatEncoding> Engine::Impl::EncodeConversation(
    const std::vector<model::ChatMessage>& previous, const std::vector<model::ChatMessage>& added,
    const std::string& tools_json, bool add_generation_prompt) const {
  auto fail = [](const absl::Status& s) { return WithFieldPrefix(s, "input.chat: ", "input.chat"); };
  std::vector<model::ChatMessage> all = previous;
  all.insert(all.end(), added.begin(), added.end());
  absl::StatusOr<std::string> full_text = chat->Render(all, tools_json, add_generation_prompt);
  if (!full_text.ok()) return fail(full_text.status());
  ChatEncoding enc;
  absl::StatusOr<std::vector<int>> full = model::EncodeRenderedChat(*full_text, *tokenizer);
  if (!full.ok()) return fail(full.status());
  enc.full = std::move(*full);
  if (previous.empty()) {
    // A session without a conversation yet (text or token input before): the new
    // messages' render, without the template's leading BOS in the middle of a session.
    std::string text = *full_text;
    const std::string& bos = chat->bos_token();
    if (!bos.empty() && text.compare(0, bos.size(), bos) == 0) text.erase(0, bos.size());
    absl::StatusOr<std::vector<int>> suffix = model::EncodeRenderedChat(text, *tokenizer);
    if (!suffix.ok()) return fail(suffix.status());
    enc.suffix = std::move(*suffix);
    return enc;
  }
  absl::StatusOr<std::string> prev_text = chat->Render(previous, tools_json, false);
  if (!prev_text.ok()) return fail(prev_text.status());
  size_t common = 0;
  while (common < prev_text->size() && common < full_text->size() && (*prev_text)[common] == (*full_text)[common]) {
    ++common;
  }
  absl::StatusOr<std::vector<int>> suffix = model::EncodeRenderedChat(full_text->substr(common), *tokenizer);
  if (!suffix.ok()) return fail(suffix.status());
  enc.suffix = std::move(*suffix);
  return enc;
}

absl::StatusOr<Engine::Impl::ChatEncoding> Engine::Impl::EncodeReply(const std::vector<model::ChatMessage>& previous,
                                                                   const model::ChatMessage& reply,
                                                                   const std::string& tools_json) const {
  std::vector<model::ChatMessage> all = previous;
  all.push_back(reply);
  ECHOKV_ASSIGN_OR_RETURN(std::string ended, chat->Render(all, tools_json, false));
  ECHOKV_ASSIGN_OR_RETURN(std::vector<int> ended_ids, model::EncodeRenderedChat(ended, *tokenizer));
  ChatEncoding enc;
  enc.full = std::move(ended_ids);
  all.push_back(MakeMessage("user", "next"));
  absl::StatusOr<std::string> continued = chat->Render(all, tools_json, true);
  if (continued.ok()) {
    absl::StatusOr<std::vector<int>> next_ids = model::EncodeRenderedChat(*continued, *tokenizer);
    if (next_ids.ok()) {
      size_t common = 0;
      while (common < enc.full.size() && common < next_ids->size() && enc.full[common] == (*next_ids)[common]) {
        ++common;
      }
      enc.full.resize(common);
    }
  }
  return enc;
}

std::vector<int> Engine::Impl::NewChatTokens(const ChatEncoding& enc, const std::vector<int>& held) const {
  if (!held.empty() && enc.full.size() > held.size() && std::equal(held.begin(), held.end(), enc.full.begin())) {
    return std::vector<int>(enc.full.begin() + held.size(), enc.full.end());
  }
  // The session is not a prefix of the re-rendered conversation (a template that
  // renders earlier turns differently once later ones exist, an assistant turn left
  // open, text input before): append what the render adds after the previous render.
  ECHOKV_LOG(WARNING) << "chat append: the session is not a prefix of the whole conversation's tokens; appending "
                         "the rendered suffix (" << enc.suffix.size() << " tokens)";
  return enc.suffix;
}

}  // namespace echokv::server
