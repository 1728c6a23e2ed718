#include "server/doors/grpc/reply_convert.h"

#include "absl/time/time.h"

namespace echokv::server {

namespace pb = ::echokv::v1;

void FillConfig(const compression::CompressionConfig& cfg, pb::CompressionConfig* out) {
  out->set_policy(std::string(compression::PolicyName(cfg.policy)));
  out->set_budget(cfg.budget);
  out->set_lookahead(cfg.lookahead);
  out->set_workspace(cfg.EffectiveWorkspace());
  out->set_window(cfg.stage2_window);
  out->set_bootstrap(std::string(compression::BootstrapName(cfg.bootstrap)));
  out->set_repair(cfg.repair);
  out->set_snapkv_window(cfg.snapkv_window);
  out->set_snapkv_kernel(cfg.snapkv_kernel);
  out->set_cache_dtype(kernels::KvDtypeName(cfg.cache_dtype));
  if (cfg.target_mass.has_value()) out->set_target_mass(*cfg.target_mass);
}

void FillReport(const compression::CompressionReport& r, pb::CompressionReport* out) {
  FillConfig(r.config, out->mutable_config());
  out->set_context_tokens(r.context_tokens);
  out->set_num_layers(r.num_layers);
  out->set_num_kv_heads(r.num_kv_heads);
  for (int64_t n : r.retained_per_layer) out->add_retained_per_layer(n);
  out->set_retained_entries(r.retained_entries);
  out->set_total_entries(r.total_entries);
  out->set_retained_kv_bytes(r.retained_kv_bytes);
  out->set_full_kv_bytes(r.full_kv_bytes);
  for (const compression::PhaseTime& p : r.phases) {
    pb::PhaseTime* pt = out->add_phases();
    pt->set_phase(p.phase);
    pt->set_seconds(p.seconds);
  }
  out->set_forward_passes(r.forward_passes);
  out->set_scoring_passes(r.scoring_passes);
  out->set_evicted(r.evicted);
  out->set_overlap_w1_w2(r.overlap_w1_w2);
  out->set_overlap_w1_final(r.overlap_w1_final);
  out->set_overlap_w2_final(r.overlap_w2_final);
  for (int t : r.lookahead_tokens) out->add_lookahead_tokens(t);
  for (double m : r.retained_mass) out->add_retained_mass(m);
  out->set_retained_mass_mean(r.RetainedMassMean());
  out->set_retained_mass_min(r.RetainedMassMin());
  out->set_total_seconds(r.TotalSeconds(/*include_prefill=*/true));
  out->set_lookahead_seconds(r.SecondsOf("bootstrap") + r.SecondsOf("round1") + r.SecondsOf("repair") +
                             r.SecondsOf("round2"));
}

void FillSession(const SessionInfo& s, pb::Session* out) {
  out->set_id(s.id);
  out->set_memory(std::string(MemoryModeName(s.memory)));
  out->set_hot_kv_bytes(s.retained_kv_bytes);
  out->set_cold_kv_bytes(s.cold_kv_bytes);
  out->set_tokens_seen(s.tokens_seen);
  out->set_retained_entries(s.retained_entries);
  out->set_retained_kv_bytes(s.retained_kv_bytes);
  out->set_full_kv_bytes(s.full_kv_bytes);
  out->set_bytes_saved(s.full_kv_bytes - s.retained_kv_bytes);
  out->set_compression_ratio(s.full_kv_bytes > 0 ? static_cast<double>(s.retained_kv_bytes) / s.full_kv_bytes
                                                 : 1.0);
  FillConfig(s.config, out->mutable_compression());
  out->mutable_compression()->set_memory(std::string(MemoryModeName(s.memory)));
  FillReport(s.last_report, out->mutable_last_report());
  out->set_retained_mass(s.last_report.RetainedMassMean());
  out->set_created_unix_ms(absl::ToUnixMillis(s.created));
  out->set_last_used_unix_ms(absl::ToUnixMillis(s.last_used));
  out->set_ttl_seconds(absl::ToInt64Seconds(s.ttl));
  out->set_busy(s.busy);
  for (const model::ChatMessage& m : s.messages) {
    pb::ChatMessage* o = out->add_messages();
    o->set_role(m.role);
    o->set_content(m.content);
    o->set_name(m.name);
    o->set_tool_call_id(m.tool_call_id);
    for (const model::ToolCall& c : m.tool_calls) {
      pb::ToolCall* t = o->add_tool_calls();
      t->set_id(c.id);
      t->set_type(c.type);
      t->set_function_name(c.name);
      t->set_arguments_json(c.arguments_json);
    }
  }
}

void FillLayers(const std::vector<LayerCacheInfo>& layers, google::protobuf::RepeatedPtrField<pb::LayerCache>* out) {
  for (size_t l = 0; l < layers.size(); ++l) {
    pb::LayerCache* lc = out->Add();
    lc->set_layer(static_cast<int>(l));
    lc->set_retained(layers[l].retained);
    lc->set_kv_bytes(layers[l].kv_bytes);
    for (size_t g = 0; g < layers[l].groups.size(); ++g) {
      const GroupCache& gc = layers[l].groups[g];
      pb::KvGroupCache* o = lc->add_groups();
      o->set_group(static_cast<int>(g));
      o->set_retained(gc.retained);
      o->set_kv_bytes(gc.kv_bytes);
      o->set_retained_mass(gc.retained_mass);
      for (int64_t p : gc.positions) o->add_positions(p);
    }
  }
}

// ---- reactors ----

// A message as the raw bytes the service's raw methods write.

}  // namespace echokv::server
