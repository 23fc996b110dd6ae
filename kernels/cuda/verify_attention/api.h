// CUDA verify attention for MLA (absorbed latent, page size 1, tree-masked tail): the public
// plan / run API around the kernel family in this directory.
//
// Plan once per batch, run once per layer:
//   1. VerifyAttentionDeviceInfo::Query() reads the SM count, architecture and the opt-in
//      shared-memory limit of the current device (once per process / device).
//   2. PlanVerifyAttention() runs on the host from host copies of q_indptr / kv_indptr. It
//      picks the kernel configuration (rows per CTA, keys per tile) and splits each request's
//      keys over CTAs so the work (with a per-split overhead term) is balanced over the SMs.
//      Requests that end up with one split are written directly; split requests write fp32
//      partial outputs + log2-LSE into the workspace and a combine kernel merges them.
//   3. UploadVerifyAttentionPlan() copies the plan's work lists into the fixed device
//      workspace (one async copy on the stream; pageable source, so the plan may be dropped
//      once it returns).
//   4. VerifyAttentionCuda() launches the attention kernel and (when needed) the combine
//      kernel on params.stream: no host synchronisation, no allocation, so a layer (or a
//      whole step of layers) can be captured in a CUDA graph and replayed while the plan and
//      workspace contents stay the same.
//
// The semantics are those of kernels/verify_attention.h (the reference). Supported here:
// dtype bf16, qk_dim 576, v_dim 512, mask_words <= 2 (<= 128 tail rows per request), any
// head count >= 1, a bf16 or an FP8 latent cache (kv_fp8: kernels/kv_fp8.h, 656 bytes a key).
// SupportsVerifyAttentionCuda() says which case is not supported.
//
// Kernel configurations (VerifyKernelConfig; the planner picks one per batch, the variants
// behind them are declared once in verify_attention/variants.h):
//   kM16   16 folded rows per CTA, mma.sync m16n8k16: 5 stages on sm_90, 2 stages within
//          99 KB of shared memory on sm_80 / sm_120. Tiny decode batches and non-sm_90.
//   kS64   64 folded rows, 64-key tiles, warp-specialised wgmma "seesaw" schedule (sm_90a;
//          docs/KERNEL_NOTES.md): kAuto's choice on sm_90 for every other batch.
// FP8 latent cache: kKm16 on sm_90 (kAuto's choice there below IsManyRowsBatch, positional
// plans always: keys on the wgmma M side, the stored codes converted to f16 operands in
// registers, exact; scales applied to the scores and to P), kS64 on sm_90 for batches with many
// rows per request (variants.h, IsManyRowsBatch: the seesaw schedule on f16 tiles its math
// warpgroups convert from the stored rows; a latent value beyond f16's range saturates), kM16
// elsewhere (its FP8 variants gather the stored rows into 2 FP8 stages and dequantize each into one
// bf16 tile: bf16(e4m3 x scale), one rounding; two CTAs per SM on sm_90, one within 99 KB
// elsewhere). With a staging area in the workspace (max_staged_keys), batches with >= 256
// rows in a request (IsStagedFp8Batch) whose keys fit it run kS64Staged instead: the keys
// dequantized once into bf16 rows of the workspace (same rounding), then the bf16 kS64
// kernel over them. Speed against the bf16 cache: docs/PERF.md.
//
// Positional plans (VerifyPlanOptions::positional: the engine's batch-invariant mode). A
// node's visible keys (the request's context, then its visible tail rows in index order: for
// a draft tree, its ancestors and itself) are numbered 0..n-1; for a tree that number is the
// key's position in the sequence. Each work item holds the heads of *one* node (16 or 64 of
// them) and a range of those keys, cut at lengths that depend on n alone
// (PositionalSplitKeys, multiples of 128 so every variant's tiles, and the seesaw kernel's
// tile pairs, start at the same positions); splits are merged in split order by the combine
// kernel in one fixed layout. A range that reaches the tail is read through an index list the
// planner has the GPU build (context slots, then the node's visible tail slots) in the
// workspace; the others read the request's own slot list. The kernels are the plain ones (any
// configuration; the engine asks for PositionalConfigFor(device)). A row's output is then a
// function of its query and its visible keys in order, nothing else: not the batch, not the tree's
// other nodes, not the occupancy of the GPU. A node of a draft tree gets bit for bit what the same
// token gets when decoded alone at that position (lossless speculative decoding, bit-exact). The
// planner needs the host copy of the tree mask (VerifyPlanOptions::host_tree_mask). When the
// partial outputs or the index lists exceed the workspace, the plan runs in several passes (each:
// index lists, attention, combine); a row's arithmetic does not depend on its pass.
// Shared-context positional plans (VerifyPlanOptions::positional_shared_context) let a work
// item hold several nodes for the splits that lie wholly in the context (the same keys at the
// same positions for all of them), which is still row by row the same arithmetic.
//
// Shared prefixes (default plans; VerifyPlanOptions::host_kv_indices): adjacent requests
// whose slot lists begin with the same context slots (at least kSharedPrefixMinKeys of them:
// forked sessions, a common system prompt) and whose rows fit one row tile together are
// packed into tiles of several requests' rows. The shared prefix is read once per pack for
// all of them (one work item per prefix split holds every row of the pack: the kernels see one
// request whose keys are all context, nothing masked), each request's own keys after the
// prefix (its context beyond it and its tail, masked as usual) run in its own splits, and one
// combine item per request merges its prefix and own splits (split s of the request's local
// row i at partial_row0 + s * rows_per_cta + i: the pack's partial block is laid out by
// split, the requests side by side). Only when the head count is below the rows per CTA
// (tensor parallelism: 8 or 16 heads per rank) can a tile hold several requests; with 64
// heads per rank every request fills its own tiles and the L2 cache is what shares the keys.
//
// Tested on an H200 (sm_90a); the sm_120 build compiles but has not run on a device.
//
// Plain C++ header (no CUDA types): includable from host code that is not compiled by nvcc.
// The planner half (Supports, Plan, BytesFor) is plain C++ too (target
// verifyd_verify_attention_plan, built without CUDA); Query, Allocate, Free, Upload and
// VerifyAttentionCuda need the CUDA library (verifyd_kernels_cuda).
// Thread-safety: the functions are reentrant; a workspace must be used by one stream at a
// time; a plan is immutable after PlanVerifyAttention() returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/verify_attention/config.h"
#include "kernels/verify_attention.h"

namespace verifyd::kernels::cuda {

// What the planner needs to know about the device. A plain struct: tests fill it by hand.
struct VerifyAttentionDeviceInfo {
  int num_sms = 0;   // multiprocessors
  int cc_major = 0;  // compute capability
  int cc_minor = 0;
  int max_smem_per_block = 0;  // opt-in dynamic shared memory limit per block (bytes)
  int max_smem_per_sm = 0;     // shared memory per multiprocessor (bytes)
  // Queries the current CUDA device (defined in the CUDA library).
  static absl::StatusOr<VerifyAttentionDeviceInfo> Query();
};

// The configuration of positional plans on a device of compute capability `cc_major`: on
// sm_90 the seesaw kernel (its producer streams keys best), or the keys-on-M kernel for an FP8
// cache (`kv_fp8`); the 16-row kernel elsewhere. A function of the device and the cache format
// only, so every step of an engine uses the same one.
VerifyKernelConfig PositionalConfigFor(int cc_major, bool kv_fp8 = false);

// Positional plans: a node with n visible keys runs in ceil(n / len) splits of `len` keys,
// len = the smallest multiple of 128 that covers n in at most
// min(ceil(n / chunk_keys), max_splits) splits. Depends on n (and the rule, one per engine)
// alone.
inline constexpr int kPositionalChunkKeys = 1024;
inline constexpr int kPositionalMaxSplits = 32;
struct PositionalSplitRule {
  int chunk_keys = kPositionalChunkKeys;  // > 0
  int max_splits = kPositionalMaxSplits;  // > 0
};
int64_t PositionalSplitKeys(int64_t visible_keys, const PositionalSplitRule& rule = {});

// Shared-context positional plans (VerifyPlanOptions::positional_shared_context): the split
// length of PositionalSplitKeys(the visible key count rounded up to a multiple of
// kPositionalSharedRound), so that the nodes of a tree (whose counts differ by less than 128)
// mostly share their split boundaries. Depends on the count alone.
inline constexpr int kPositionalSharedRound = 4096;
// Split groups (VerifyPlanOptions::positional_split_group = -1): splits are grouped until the
// plan has about this many work items per SM.
inline constexpr int kPositionalGroupWaves = 4;
int64_t PositionalSharedSplitKeys(int64_t visible_keys, const PositionalSplitRule& rule = {});

// Positional plans: one index list built on the GPU before a pass's attention:
// list[0 .. end - begin) = the node's visible keys [begin, end) as slot ids, i.e. for key k
// kv_indices[src + k] below ctx, else kv_indices[src + ctx + j], j = the (k - ctx)-th set bit
// of the node's mask row (bits below num_nodes). 8 int32, copied verbatim to the device.
struct VerifyIndexTask {
  int32_t dst;        // first entry of the list in the workspace's index area (per pass)
  int32_t src;        // kv_indptr[b]
  int32_t ctx;        // P_b
  int32_t mask_row;   // the node's row (q_indptr[b] + t)
  int32_t num_nodes;  // n_b
  int32_t begin;      // the node's key range
  int32_t end;
  int32_t pad;
};

// One CTA's work: a tile of one request's folded rows (row = node * heads + head) against a
// range of that request's keys. 12 int32, copied verbatim to the device.
struct VerifyWorkItem {
  int32_t q_row0;      // q_indptr[b]: first query row of the request
  int32_t num_nodes;   // n_b: tail rows of the request
  int32_t kv_off;      // kv_indptr[b]; < 0: the keys are index list entries -kv_off - 1 on
                       // (positional plans: the workspace's index area). Positional plans
                       // also set num_nodes = last node of the tile + 1 (the kernels' row
                       // count ends there) and kv_len = kv_end + num_nodes (no key of the
                       // range counts as tail: nothing is masked before kv_end).
  int32_t kv_len;      // L_b (keys = context P_b = L_b - n_b, then n_b tail keys)
  int32_t fold_begin;  // first folded row of this tile (within the request)
  int32_t kv_begin;    // key range [kv_begin, kv_end) within the request
  int32_t kv_end;
  int32_t partial_row;  // -1: write out/lse directly; else first workspace partial row
  // > 0 (positional plans, kernels with VariantInfo::split_groups): the range holds several
  // consecutive splits of split_keys keys each (a multiple of 128); the kernel computes each
  // from a fresh softmax state exactly as a work item of its own would, and writes split j of
  // the range to partial rows partial_row + j * rows_per_cta + i, or, when the range starts
  // at the rows' first key (kv_begin == 0), folds split j into split 0's rows as the combine
  // would (fold.cuh; VerifyCombineItem::folded_splits): a big batch then writes one partial
  // row per row tile instead of one per split. 0: one range, one result.
  int32_t split_keys;
  int32_t pad[3];
};

// Merge of the splits of one row tile of one split request. 8 int32.
struct VerifyCombineItem {
  int32_t out_row0;  // first global folded output row: q_indptr[b] * heads + fold_begin
  int32_t num_rows;  // rows in this tile (<= rows per CTA)
  int32_t num_splits;
  int32_t partial_row0;  // split s of local row i: partial row partial_row0 + s*rows_per_cta + i
  // Positional plans: splits [0, folded_splits) were already folded by the attention kernel
  // into split 0's partial rows (a split group that starts at the row's first key,
  // VerifyWorkItem::split_keys); the combine continues the left fold (fold.cuh) from split
  // max(1, folded_splits). Other plans: 0.
  int32_t folded_splits;
  int32_t pad[3];
};

// One attention launch and its combine over a contiguous range of the work and combine lists
// (partial rows are numbered from 0 in every pass). Plans that fit the workspace have one.
struct VerifyPass {
  int32_t work_begin = 0, work_count = 0;
  int32_t combine_begin = 0, combine_count = 0;
  int32_t task_begin = 0, task_count = 0;  // positional plans: index lists built first
};

struct VerifyAttentionPlan {
  VerifyKernelConfig config = VerifyKernelConfig::kM16;
  bool kv_fp8 = false;  // made for an FP8 latent cache (VerifyAttentionParams::kv_fp8)
  int rows_per_cta = 16;
  int keys_per_tile = 32;
  int num_heads = 0;
  int batch = 0;
  int total_rows = 0;
  int max_splits = 1;                      // largest number of splits of any request
  int64_t partial_rows = 0;                // workspace partial rows used (largest pass)
  std::vector<VerifyWorkItem> work;        // one per CTA of the attention kernel
  std::vector<VerifyCombineItem> combine;  // one per split row tile
  std::vector<VerifyPass> passes;          // empty: one pass over everything
  bool positional = false;                 // positional plan: fixed combine layout too (whole rows)
  std::vector<VerifyIndexTask> index_tasks;  // positional: index lists to build
  int64_t index_entries = 0;                 // positional: index entries used (largest pass)
  // Shared prefixes: the packs of requests that read one prefix together, and the key reads
  // that saves (sum over packs of (requests - 1) x prefix keys).
  int shared_packs = 0;
  int64_t shared_reads_saved = 0;
  // kS64Staged: keys dequantized into the workspace's staging rows first (kv_indptr[batch]).
  int64_t staged_keys = 0;
  // The kernel variant the planner resolved (its index in the variant table) and the device
  // the plan was made for: VerifyAttentionCuda launches it without querying the device or
  // searching the table (a plan runs on a device like the one it was made for).
  int variant = -1;
  int device_cc_major = 0;
  int device_sms = 0;
};

// Fixed device workspace: work lists + fp32 partial outputs + their log2-LSE. Allocated
// once, reused. The planner reads only the capacities (a zero `device` is fine there).
struct VerifyAttentionWorkspace {
  void* device = nullptr;  // base of the device allocation
  size_t bytes = 0;
  int max_work_items = 0;
  int max_combine_items = 0;
  int64_t max_partial_rows = 0;   // each holds 512 fp32 + one fp32 LSE
  int max_index_tasks = 0;        // positional plans: index lists per plan
  int64_t max_index_entries = 0;  // positional plans: int32 entries of one pass's lists
  // kS64Staged plans: keys of one batch dequantized to bf16 rows (1,156 bytes each with its
  // identity slot id); 0: no staging area (kAuto never stages, a forced kS64Staged plan is
  // RESOURCE_EXHAUSTED).
  int64_t max_staged_keys = 0;

  // Bytes of a workspace of this capacity (plain C++).
  static size_t BytesFor(int max_work_items, int max_combine_items, int64_t max_partial_rows,
                         int max_index_tasks = 0, int64_t max_index_entries = 0,
                         int64_t max_staged_keys = 0);
  // cudaMalloc's a workspace of the given capacity; Free() releases it.
  static absl::StatusOr<VerifyAttentionWorkspace> Allocate(
      int max_work_items, int max_combine_items, int64_t max_partial_rows, int max_index_tasks = 0,
      int64_t max_index_entries = 0, int64_t max_staged_keys = 0);
  // Capacity that any batch within verifyd's limits fits (about 75 MB; index lists for
  // positional plans of moderate size), plus a staging area of max_staged_keys keys.
  static absl::StatusOr<VerifyAttentionWorkspace> AllocateDefault(int64_t max_staged_keys = 0);
  // cudaMalloc's a workspace of `capacity`'s capacity fields (DefaultCapacity,
  // PositionalCapacity).
  static absl::StatusOr<VerifyAttentionWorkspace> AllocateLike(
      const VerifyAttentionWorkspace& capacity);
  absl::Status Free();

  // Capacities without memory (plain C++; the planner and the memory plan read them):
  // AllocateDefault's, and the engine's for positional (batch-invariant) steps of up to
  // `max_rows` query rows (tree nodes, all requests) at `local_heads` heads: one work item per
  // (node, head tile, split) at up to `max_splits` splits, one combine item per (node, head tile),
  // three index lists a node (16-head tiles bound every configuration), `max_partial_rows` partial
  // rows and 16 M index entries a pass (a step that needs more runs in passes).
  static VerifyAttentionWorkspace DefaultCapacity(int64_t max_staged_keys = 0);
  static VerifyAttentionWorkspace PositionalCapacity(int64_t max_rows, int64_t local_heads,
                                                     int max_splits, int64_t max_partial_rows);
  // BytesFor this workspace's capacity.
  size_t CapacityBytes() const;
};

// OkStatus when the CUDA path computes this case; else UNIMPLEMENTED naming the field
// (dtype, qk_dim, v_dim, mask_words) or the device, or INVALID_ARGUMENT for malformed scalar
// fields.
absl::Status SupportsVerifyAttentionCuda(const VerifyAttentionParams& params,
                                         const VerifyAttentionDeviceInfo& device);

struct VerifyPlanOptions {
  VerifyKernelConfig config = VerifyKernelConfig::kAuto;
  // Cost of one split in keys' worth of streaming (prologue, Q load, epilogue, combine).
  int split_overhead_keys = 256;
  // Upper bound on splits of one request (0: no bound other than the workspace).
  int max_splits = 0;
  // Shortest split in key tiles of the chosen configuration (>= 1).
  int min_split_tiles = 2;
  // A positional plan (see "Positional plans" above; batch-invariant), with `config` (kAuto:
  // PositionalConfigFor the device). Needs host_tree_mask.
  bool positional = false;
  // Positional plans: the splits of a request's nodes that lie wholly in its context are
  // shared by those nodes (one work item holds several nodes' heads, the context keys are
  // read once for all of them, as the default plans do) when the rows per CTA are a multiple
  // of the head count; only the splits that reach the tail go node by node. A row's keys,
  // split boundaries (PositionalSharedSplitKeys) and merge order are still functions of the
  // row alone, so the plan is as batch-invariant as the per-node one. Checked on the host
  // (kernels_verify_attention_plan_test) and on an H200 (the GPU tests); the engine's default.
  bool positional_shared_context = false;
  // Positional plans: the split lengths (PositionalSplitKeys).
  PositionalSplitRule positional_split;
  // Positional plans on a variant with split groups (VariantInfo::split_groups): up to this
  // many consecutive context-only splits of one head tile go to one work item
  // (VerifyWorkItem::split_keys), which computes each split exactly as its own item would:
  // the bits do not change, only how many CTAs the plan has (fewer prologues, Q loads and
  // pipeline fills when the batch already fills the GPU). -1: chosen from the batch (about
  // kPositionalGroupWaves CTAs per SM); 0 or 1: one split per item.
  int positional_split_group = -1;
  // Positional plans only (required there): host copy of params.tree_mask
  // ([total_rows, mask_words]), from which the planner counts each node's visible keys.
  const uint64_t* host_tree_mask = nullptr;
  // Default plans: host copy of params.kv_indices ([kv_indptr[batch]]). When set, requests
  // that share a prefix of their slot lists share its reads ("Shared prefixes" above); the
  // planner compares adjacent requests' lists (memcmp; a batch of 32 forks of a 64k-token
  // context compares 2M entries). Positional plans ignore it (their rows must not depend on
  // the batch).
  const int32_t* host_kv_indices = nullptr;
};

// Shared prefixes: the shortest common prefix (in keys) worth sharing.
inline constexpr int kSharedPrefixMinKeys = 1024;

// Computes the plan from host copies of q_indptr / kv_indptr ([batch + 1] each). Checks the
// index arrays (monotone, L_b >= n_b, n_b <= 64 * mask_words) and that the plan fits the
// workspace capacity (splits are reduced until it does; positional plans never change their
// splits: they run in passes instead, and need work / combine / index-task capacity for one
// item per (node, head tile, split) / (node, head tile) / (node, split reaching the tail),
// RESOURCE_EXHAUSTED otherwise).
absl::StatusOr<VerifyAttentionPlan> PlanVerifyAttention(const VerifyAttentionParams& params,
                                                        const int32_t* host_q_indptr,
                                                        const int32_t* host_kv_indptr,
                                                        const VerifyAttentionDeviceInfo& device,
                                                        const VerifyAttentionWorkspace& workspace,
                                                        const VerifyPlanOptions& options = {});

// Copies plan.work / plan.combine into the workspace on `stream` (cudaStream_t) with
// cudaMemcpyAsync from the plan's host vectors (pageable: the copy is staged, so the plan may
// be dropped once this returns). Not graph-capturable; run it before capture.
absl::Status UploadVerifyAttentionPlan(const VerifyAttentionPlan& plan,
                                       const VerifyAttentionWorkspace& workspace, void* stream);

// Runs the attention (and combine) kernels for a plan made from the same batch shape.
// Device pointers in params. Graph-capturable.
absl::Status VerifyAttentionCuda(const VerifyAttentionParams& params,
                                 const VerifyAttentionPlan& plan,
                                 const VerifyAttentionWorkspace& workspace);

}  // namespace verifyd::kernels::cuda
