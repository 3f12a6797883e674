#include "node/flag_sections.h"

namespace starling {
namespace {

using S = FlagSection;

constexpr FlagSectionInfo kSections[] = {
    {S::kModelAndData,
     "Model and data flags: what each node trains, on which examples", false},
    {S::kTraining,
     "Training flags: the inner optimizer, the run's length, and how the "
     "nodes' models are combined (DiLoCo, gossip, DDP)",
     false},
    {S::kSwarm,
     "Swarm flags: peers, membership, the timing of rounds and pushes, and "
     "the (emulated) network",
     false},
    {S::kCompression,
     "Compression flags: how pseudo-gradients and pushes travel", false},
    {S::kSecurity,
     "Security flags: TLS, admission, limits per peer, and defences against "
     "hostile pseudo-gradients",
     false},
    {S::kOperations,
     "Operations flags: run directory, checkpoints, logs, health checks and "
     "metrics",
     false},
    {S::kTestOnly,
     "Test-only flags: fault injection for Starling's own tests, not for "
     "real runs",
     /*hidden=*/true},
};

// One row per flag name. A flag that several subcommands share (--out,
// --nodes, --compression, --chunk_bytes) has one section for all of them.
constexpr PlacedFlag kTable[] = {
    // Model and data.
    {"model", S::kModelAndData},
    {"layers", S::kModelAndData},
    {"width", S::kModelAndData},
    {"heads", S::kModelAndData},
    {"context", S::kModelAndData},
    {"vocab", S::kModelAndData},
    {"data", S::kModelAndData},
    {"val_data", S::kModelAndData},
    {"token_dtype", S::kModelAndData},
    {"cache_dir", S::kModelAndData},
    {"shard", S::kModelAndData},
    {"shard_mode", S::kModelAndData},
    {"val_fraction", S::kModelAndData},
    {"drift", S::kModelAndData},
    // bench allreduce: the buffer it reduces stands in for a model's.
    {"sizes_mib", S::kModelAndData},
    // tokenize: the text in, the SentencePiece model, the tokens out.
    {"input", S::kModelAndData},
    {"model_prefix", S::kModelAndData},
    {"sp_model", S::kModelAndData},
    {"vocab_size", S::kModelAndData},
    {"sp_model_type", S::kModelAndData},
    {"val_input", S::kModelAndData},
    {"val_out", S::kModelAndData},

    // Training: the run, the inner optimizer, then the algorithm across
    // nodes and its adaptive sync.
    {"steps", S::kTraining},
    {"batch", S::kTraining},
    {"seed", S::kTraining},
    {"device", S::kTraining},
    {"precision", S::kTraining},
    {"gpu_memory_fraction", S::kTraining},
    {"memory_limit_mb", S::kTraining},
    {"threads", S::kTraining},
    {"optimizer", S::kTraining},
    {"lr", S::kTraining},
    {"warmup", S::kTraining},
    {"weight_decay", S::kTraining},
    {"beta1", S::kTraining},
    {"beta2", S::kTraining},
    {"momentum", S::kTraining},
    {"clip", S::kTraining},
    {"algo", S::kTraining},
    {"inner_steps", S::kTraining},
    {"outer", S::kTraining},
    {"outer_lr", S::kTraining},
    {"outer_momentum", S::kTraining},
    {"overlap", S::kTraining},
    {"overlap_steps", S::kTraining},
    {"round_seconds", S::kTraining},
    {"weighting", S::kTraining},
    {"min_inner_steps", S::kTraining},
    {"max_inner_steps", S::kTraining},
    {"drift_detector", S::kTraining},
    {"divergence_threshold", S::kTraining},
    {"gossip_momentum", S::kTraining},
    {"gossip_outer_lr", S::kTraining},
    {"slowdown", S::kTraining},
    {"slow", S::kTraining},
    // bench allreduce: how long it runs, as --steps for training.
    {"iterations", S::kTraining},

    // Swarm: who takes part, how they find each other, how long they wait,
    // and the network between them (real or emulated).
    {"nodes", S::kSwarm},
    {"listen", S::kSwarm},
    {"advertise", S::kSwarm},
    {"relay", S::kSwarm},
    {"peers", S::kSwarm},
    {"node_id", S::kSwarm},
    {"run_id", S::kSwarm},
    {"min_members", S::kSwarm},
    {"hosts", S::kSwarm},
    {"found_after", S::kSwarm},
    {"connect_timeout", S::kSwarm},
    {"suspect_timeout", S::kSwarm},
    {"round_deadline", S::kSwarm},
    {"round_timeout", S::kSwarm},
    {"linger_seconds", S::kSwarm},
    {"train_alone", S::kSwarm},
    {"gossip_peers", S::kSwarm},
    {"gossip_timeout", S::kSwarm},
    {"chunk_bytes", S::kSwarm},
    {"link_bandwidth_mbps", S::kSwarm},
    {"link_latency_ms", S::kSwarm},
    {"partition_file", S::kSwarm},
    {"kill", S::kSwarm},
    {"restart", S::kSwarm},
    {"join", S::kSwarm},
    {"leave", S::kSwarm},
    {"partition", S::kSwarm},
    {"nat", S::kSwarm},

    // Compression.
    {"compression", S::kCompression},
    {"error_feedback", S::kCompression},
    {"ef_decay", S::kCompression},
    {"small_tensor_elems", S::kCompression},
    {"small_tensor_codec", S::kCompression},

    // Security: the channel, admission, per-host limits, then robust
    // aggregation and the sim's hostile peers that exercise it.
    {"insecure", S::kSecurity},
    {"tls_cert", S::kSecurity},
    {"tls_key", S::kSecurity},
    {"tls_ca", S::kSecurity},
    {"tls_require_client_cert", S::kSecurity},
    {"tls_server_name", S::kSecurity},
    {"tls_bind_node_ids", S::kSecurity},
    {"join_token_file", S::kSecurity},
    {"peer_rate_limit", S::kSecurity},
    {"peer_max_streams", S::kSecurity},
    {"stream_idle_timeout", S::kSecurity},
    {"aggregate", S::kSecurity},
    {"norm_bound", S::kSecurity},
    {"poison", S::kSecurity},

    // Operations.
    {"out", S::kOperations},
    // export: what it reads, and whether a node apart from the swarm may go.
    {"from", S::kOperations},
    {"allow_apart", S::kOperations},
    {"resume", S::kOperations},
    {"resume_if_exists", S::kOperations},
    {"eval_every", S::kOperations},
    {"checkpoint_every", S::kOperations},
    {"log_every", S::kOperations},
    {"log_format", S::kOperations},
    {"snapshot_every", S::kOperations},
    {"health_port", S::kOperations},
    {"metrics_port", S::kOperations},
    {"watchdog_multiple", S::kOperations},
    {"watchdog_min_seconds", S::kOperations},

    // Test-only.
    {"test_crash_at", S::kTestOnly},
    {"test_relay_fault", S::kTestOnly},
    {"test_poison", S::kTestOnly},
    {"test_stall", S::kTestOnly},
};

}  // namespace

absl::Span<const FlagSectionInfo> FlagSections() { return kSections; }

absl::Span<const PlacedFlag> FlagTable() { return kTable; }

std::optional<FlagSection> SectionOfFlag(absl::string_view name) {
  for (const PlacedFlag& f : kTable) {
    if (f.name == name) return f.section;
  }
  return std::nullopt;
}

}  // namespace starling
