#!/usr/bin/env python3
"""Builds the tiny DeepSeek-V3 reference checkpoints and their Hugging Face transformers outputs.

What it writes, for each of the tiny models made with transformers' DeepseekV3Config /
DeepseekV3ForCausalLM (float32, fixed seeds): the checkpoint in tests/data/checkpoints/<name>/
(config.json and safetensors, nothing else) and its reference outputs in
tests/data/references/<name>.json and <name>_logits.safetensors.

  dense         MLA (q_lora_rank > 0), every layer a dense SwiGLU MLP, plain RoPE. config.json in
                the transformers-4 / published DeepSeek-V3 spelling (top-level rope_theta,
                "rope_scaling": null); bf16 weights in one model.safetensors.
  moe_yarn      layer 0 dense, layers 1-2 MoE (8 routed experts, top-2, 1 shared expert, 4
                groups / top-2 groups, sigmoid scoring, noaux_tc with a non-zero
                e_score_correction_bias, norm_topk_prob, routed_scaling_factor 2.5) and YaRN RoPE
                (factor 4 over 32 original positions). config.json in the spelling transformers 5
                writes ("rope_parameters" holding rope_type and rope_theta); bf16 weights in two
                shards with model.safetensors.index.json.
  moe_yarn_fp8  the same architecture (another seed), stored as DeepSeek-V3 publishes FP8: every
                Linear weight of the decoder layers as float8_e4m3fn with a float32
                `<name>_scale_inv` per 128x128 block (scale_inv = amax / 448; the dense MLP's
                intermediate 160 and q_b_proj / kv_b_proj outputs 192 / 256 give several and
                partial blocks); embeddings, norms, lm_head and the router weight in bf16,
                e_score_correction_bias in float32. config.json in the published spelling
                ("rope_scaling" with "type": "yarn", top-level rope_theta, scoring_func,
                topk_method, moe_layer_freq) plus quantization_config; two shards with an index
                (one weight and its scale_inv happen to land in different shards).
  moe_fp8_block128  FP8 like moe_yarn_fp8 but with whole 128 x 128 blocks in the experts: hidden
                128, moe_intermediate_size 256 (two blocks; one per rank at TP 2), 8 routed
                experts in 2 groups (top-1 group), top-2, two layers (the second MoE): the dims
                at which the CUDA engine keeps the routed experts in FP8 (block-scaled grouped
                GEMMs). Routing pinned (e_score_correction_bias = 2 e: every token picks experts
                7 and 6) so that the GPU's FP8 expert path is compared with transformers without
                routing decisions near a tie (routing is what the other MoE checkpoints test).
                One shard.
  moe_fp8_mlp128  moe_fp8_block128 with a dense MLP of intermediate 256 (another seed): every
                SwiGLU MLP (dense layer, routed and shared experts) is whole 128 x 128 blocks,
                so the CUDA engine keeps all of them in FP8. Routing pinned likewise.
  moe_fp8_attn128  moe_fp8_mlp128 with 128-aligned attention projections too (another seed):
                q_lora_rank 128, qk_nope_head_dim 112 (q_b_proj rows 4 x 128), v_head_dim 128
                (o_proj columns 4 x 128) and kv_lora_rank 176 (kv_a_proj_with_mqa's 192 rows:
                one whole and one partial block, as DeepSeek-V3's 576 = 4.5 blocks), so the CUDA
                engine keeps every FP8 linear in FP8 at TP 1, 2 and 4. Routing pinned likewise.
  kimi_fp8_moe  Kimi-K2's geometry for the GPU exactness checks: kv_lora_rank 512, rope 64, 16
                heads, 16 routed experts top-4 with Kimi-K2's routing (one group, sigmoid +
                correction bias, normalised, scaling 2.827, one shared expert; not pinned),
                YaRN, every decoder Linear FP8 in 128-aligned blocks, three layers (the first
                dense), 1,024 positions. One shard.
  mla576        DeepSeek-V3's attention dimensions: kv_lora_rank 512 and qk_rope_head_dim 64 (the
                576-wide latent rows the optimised GPU verify kernels and the 656-byte FP8 KV
                format are built for; the other checkpoints' latent rows are 48 to 240 wide), YaRN
                (as moe_yarn), 8 heads, dense MLPs, two layers, bf16, one shard. qk_nope and
                v_head_dim stay 32 (absorbed before the kernels). Prompts of 9, 40 and 100
                tokens (engines must allow 128 rows a step to prefill and re-read the longest).

The MoE checkpoints set max_position_embeddings 256 while factor * original is 128: transformers
warns and uses the explicit factor (4) for both inv_freq and the softmax mscale, so a reader
must not derive the factor from the ratio.

Every checkpoint is in the published layout (without MTP layers: num_nextn_predict_layers 0):
one tensor per expert (model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight), shared
experts as model.layers.{i}.mlp.shared_experts.*, the router as model.layers.{i}.mlp.gate.weight
and model.layers.{i}.mlp.gate.e_score_correction_bias. transformers 5 keeps the routed experts
fused in its modules (experts.gate_up_proj [E, 2I, H], gate rows first, and experts.down_proj
[E, H, I]); this script splits and re-fuses them itself.

The references:
  <name>.json             versions, the config, the prompts, the greedy continuations, per
                          predicted position the top-2 logit gap, the attention softmax scale
                          (module.scaling), the RoPE inv_freq and cos/sin attention factor, and
                          (MoE) how often e_score_correction_bias changes the routing.
  <name>_logits.safetensors
                          float32 logits "prompt{k}" [len(prompt) + N - 1, vocab] of every
                          position of prompt + continuation[:-1] (one full forward).
  <name>_hidden.safetensors
                          float32 "prompt{k}" [len(prompt) + N - 1, layers, hidden]: the residual
                          stream after every decoder layer for the same positions (the
                          layers' outputs: transformers' hidden_states[l + 1], before the final
                          norm that its last hidden_states entry applies).

The references come from the float32 model holding exactly the stored values: bf16-rounded
weights (dense, moe_yarn) or the dequantized FP8 weights (w = float(fp8) * scale_inv per block),
read back from the written files. Greedy decoding uses full forwards without a KV cache (eager
attention). Self-checks: the written config.json read by transformers gives the same inv_freq
and softmax scale; the bf16 checkpoints load through DeepseekV3ForCausalLM.from_pretrained to
the same parameters, and its save_pretrained writes the same per-expert tensors; the one-forward
logits' argmax equals the step-by-step greedy tokens.

Rerun (deterministic; a Python environment with torch, transformers 5 and safetensors, e.g.
`pip install torch transformers safetensors`), from the repository root:

  python tests/data/make_reference_checkpoints.py [NAME ...]

The C++ test tests/tp_reference_checkpoint_test.cc compares the CPU engine with these files.
"""

import json
import math
import os
import sys
import shutil

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(DATA_DIR, "checkpoints")
REF_DIR = os.path.join(DATA_DIR, "references")
N_GENERATE = 24  # greedy tokens after each prompt
FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn

COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=48,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    num_mtp_layers=0,
    bos_token_id=0,
    eos_token_id=1,
    # Larger than the transformers default (0.02): peaky logits (top-2 gaps far above float
    # rounding) and router scores spread enough that routing decisions are not near-ties.
    initializer_range=0.1,
)

MOE = dict(
    intermediate_size=160,  # > 128: the dense MLP weights have several FP8 blocks
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
)

YARN = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=32,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
)


def moe_yarn(name, seed, spelling, fp8, prompt_lengths):
    """A checkpoint of the moe_yarn architecture (COMMON + MOE, YaRN, 256 positions) in two
    shards (a config of its own: fresh dicts)."""
    return dict(
        name=name,
        seed=seed,
        config=dict(COMMON, **MOE, max_position_embeddings=256, rope_parameters=dict(YARN)),
        spelling=spelling,
        fp8=fp8,
        shards=2,
        prompt_lengths=prompt_lengths,
    )


CHECKPOINTS = [
    dict(
        name="dense",
        seed=1001,
        config=dict(
            COMMON,
            intermediate_size=96,
            # All layers dense: n_routed_experts stays set as in DeepSeek-V3 configs, but
            # first_k_dense_replace = num_hidden_layers.
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=3,
            n_group=1,
            topk_group=1,
            max_position_embeddings=128,
            rope_parameters=dict(rope_type="default", rope_theta=50000.0),
        ),
        spelling="v4",
        fp8=False,
        shards=1,
        prompt_lengths=[5, 17, 40],
    ),
    moe_yarn("moe_yarn", seed=2002, spelling="v5", fp8=False, prompt_lengths=[6, 21, 40]),
    moe_yarn("moe_yarn_fp8", seed=3003, spelling="v4", fp8=True, prompt_lengths=[5, 33, 38]),
    dict(
        name="moe_fp8_block128",
        seed=4004,
        config=dict(
            COMMON,
            **dict(
                MOE,
                moe_intermediate_size=256,
                n_group=2,
                topk_group=1,
            ),
            hidden_size=128,
            num_hidden_layers=2,
            max_position_embeddings=256,
            rope_parameters=dict(YARN),
        ),
        spelling="v4",
        fp8=True,
        shards=1,
        prompt_lengths=[7, 24],
        pin_routing=True,
    ),
]

# moe_fp8_block128 with a dense MLP of whole 128 x 128 blocks too (another seed and prompts).
_BLOCK128 = next(c for c in CHECKPOINTS if c["name"] == "moe_fp8_block128")
CHECKPOINTS.append(dict(_BLOCK128, name="moe_fp8_mlp128", seed=5005,
                        config=dict(_BLOCK128["config"], intermediate_size=256),
                        prompt_lengths=[6, 20]))
# ... and with 128-aligned attention projections (kv_a's rows end in a partial block).
_MLP128 = CHECKPOINTS[-1]
CHECKPOINTS.append(dict(_MLP128, name="moe_fp8_attn128", seed=6006,
                        config=dict(_MLP128["config"], q_lora_rank=128, qk_nope_head_dim=112,
                                    v_head_dim=128, kv_lora_rank=176),
                        prompt_lengths=[8, 19]))

# DeepSeek-V3's attention dimensions (kv_lora_rank 512, qk_rope_head_dim 64: the 576-wide latent
# rows the optimised GPU verify kernels and the 656-byte FP8 cache format are built for), YaRN,
# dense MLPs, two layers of 8 heads; qk_nope / v head dims kept small (they do not reach the
# kernels: the latent attention absorbs them) so the checkpoint stays small.
_DENSE = next(c for c in CHECKPOINTS if c["name"] == "dense")
CHECKPOINTS.append(dict(
    _DENSE,
    name="mla576",
    seed=7007,
    config=dict(_DENSE["config"], num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=8, kv_lora_rank=512, qk_rope_head_dim=64,
                first_k_dense_replace=2, max_position_embeddings=256,
                rope_parameters=dict(YARN)),
    prompt_lengths=[9, 40, 100],
))

# Kimi-K2's geometry where it matters to the GPU engine's exactness: the 576-wide latent rows
# (kv_lora_rank 512, rope 64) of the optimised verify kernels, 16 heads, Kimi-K2's routing (one
# group, sigmoid scores with the correction bias, top-4 of 16 routed experts here, normalised,
# routed_scaling_factor 2.827, one shared expert), YaRN, every decoder Linear in FP8 128 x 128
# blocks with 128-aligned dims (the CUDA engine keeps experts, shared expert, dense MLP and the
# attention projections but kv_b in FP8). Routing is NOT pinned: the batch-invariance checks
# need routing decisions made from the activations. 1,024 positions, so servers can prefill
# prompts of hundreds of tokens.
CHECKPOINTS.append(dict(
    _DENSE,
    name="kimi_fp8_moe",
    seed=8008,
    config=dict(
        COMMON,
        hidden_size=256,
        intermediate_size=256,
        moe_intermediate_size=128,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=64,
        v_head_dim=64,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.827,
        max_position_embeddings=1024,
        rope_parameters=dict(YARN, original_max_position_embeddings=256),
    ),
    spelling="v4",
    fp8=True,
    shards=1,
    prompt_lengths=[11, 47, 90],
))


# ---- weights ---------------------------------------------------------------------------------


def randomize(model, cfg, gen):
    """Random weights: Linear / embedding N(0, initializer_range), norms 1 + N(0, 0.1),
    e_score_correction_bias U(-0.1, 0.1) (large enough to change some routing decisions)."""
    std = cfg.initializer_range
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.rand(b.shape, generator=gen) - 0.1)


def published_state(model, cfg):
    """The model's tensors in the published DeepSeek-V3 layout (per-expert tensors)."""
    out = {}
    inter = cfg.moe_intermediate_size
    for name, t in model.state_dict().items():
        if "rotary_emb" in name:
            continue
        t = t.detach().clone().contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                # DeepseekV3Experts.forward: linear(x, gate_up_proj[e]).chunk(2): gate first.
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def fused_state(published, model):
    """Inverse of published_state: a state dict the transformers modules load."""
    state = {}
    experts = {}
    for name, t in published.items():
        if name.endswith("_scale_inv"):
            continue
        if ".mlp.experts." in name:
            prefix, rest = name.split(".mlp.experts.")
            e, proj, _ = rest.split(".")
            experts.setdefault(prefix, {})[(int(e), proj)] = t
        else:
            state[name] = t
    for prefix, d in experts.items():
        n = 1 + max(e for e, _ in d)
        state[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]], dim=0) for e in range(n)]
        )
        state[f"{prefix}.mlp.experts.down_proj"] = torch.stack(
            [d[(e, "down_proj")] for e in range(n)]
        )
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    assert not missing and not unexpected, (missing, unexpected)


def is_fp8_linear(name):
    """Linear weights of the decoder layers that DeepSeek-V3 stores as FP8."""
    if not name.startswith("model.layers.") or not name.endswith(".weight"):
        return False
    if ".self_attn." in name:
        return name.split(".")[-2] in (
            "q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"
        )
    if ".mlp." in name:
        return name.split(".")[-2] in ("gate_proj", "up_proj", "down_proj")
    return False


def quantize_fp8(w):
    """Per 128x128 block: scale_inv = amax / 448, q = float8_e4m3fn(w / scale_inv)."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale_inv = torch.empty(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            r0, c0 = i * FP8_BLOCK, j * FP8_BLOCK
            blk = w[r0 : r0 + FP8_BLOCK, c0 : c0 + FP8_BLOCK]  # edge blocks are partial
            s = blk.abs().max().item() / FP8_MAX
            scale_inv[i, j] = s if s > 0 else 1.0
            q[r0 : r0 + FP8_BLOCK, c0 : c0 + FP8_BLOCK] = (blk / scale_inv[i, j]).to(
                torch.float8_e4m3fn
            )
    return q, scale_inv


def dequantize_fp8(q, scale_inv):
    """w = float(q) * scale_inv of its block (a float32 product)."""
    s = scale_inv.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    return q.float() * s[: q.shape[0], : q.shape[1]]


def stored_tensors(published, fp8):
    """The tensors as stored: bf16, except e_score_correction_bias (float32) and, with fp8, the
    decoder Linear weights (float8_e4m3fn + float32 scale_inv)."""
    out = {}
    for name, t in published.items():
        if name.endswith("e_score_correction_bias"):
            out[name] = t.float()
        elif fp8 and is_fp8_linear(name):
            q, s = quantize_fp8(t.float())
            out[name] = q
            out[name + "_scale_inv"] = s
        else:
            out[name] = t.to(torch.bfloat16)
    return out


def write_shards(tensors, out_dir, shards):
    names = sorted(tensors)
    if shards == 1:
        path = os.path.join(out_dir, "model.safetensors")
        save_file({n: tensors[n] for n in names}, path, metadata={"format": "pt"})
        os.chmod(path, 0o644)
        return
    per = math.ceil(len(names) / shards)
    weight_map = {}
    total = 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per : (s + 1) * per]}
        save_file(part, os.path.join(out_dir, file), metadata={"format": "pt"})
        os.chmod(os.path.join(out_dir, file), 0o644)
        for n, t in part.items():
            weight_map[n] = file
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def read_back(out_dir):
    """Every tensor of the written checkpoint, as float32 (FP8 dequantized)."""
    files = sorted(f for f in os.listdir(out_dir) if f.endswith(".safetensors"))
    raw = {}
    for file in files:
        with safe_open(os.path.join(out_dir, file), "pt") as f:
            for k in f.keys():
                raw[k] = f.get_tensor(k)
    out = {}
    for name, t in raw.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            out[name] = dequantize_fp8(t, raw[name + "_scale_inv"])
        else:
            out[name] = t.float()
    return out


# ---- config.json -----------------------------------------------------------------------------


def config_json(cfg, spelling, fp8):
    """config.json as transformers 5 writes it (save_pretrained's diff dict), in `spelling`."""
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    d = json.loads(cfg.to_json_string(use_diff=True))
    for k in ("dtype", "torch_dtype", "transformers_version", "_name_or_path"):
        d.pop(k, None)
    d["torch_dtype"] = "bfloat16"
    if spelling == "v4":
        # transformers 4 / published DeepSeek-V3: rope_theta at the top, rope_scaling with "type",
        # no head_dim / qk_head_dim, and the published MoE keys transformers 5 no longer writes.
        for k in ("head_dim", "qk_head_dim"):
            d.pop(k, None)
        rope = dict(d.pop("rope_parameters"))
        d["rope_theta"] = rope.pop("rope_theta")
        rope_type = rope.pop("rope_type")
        d["rope_scaling"] = None if rope_type == "default" else dict(rope, type=rope_type)
        if cfg.first_k_dense_replace < cfg.num_hidden_layers:
            d.update(moe_layer_freq=1, scoring_func="sigmoid", topk_method="noaux_tc")
    if fp8:
        d["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        }
    return dict(sorted(d.items()))


# ---- references ------------------------------------------------------------------------------


def greedy(model, prompt, n):
    """Greedy continuation with full forwards (no KV cache)."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt) :]


def top2_gap(logits):
    top = torch.topk(logits, 2, dim=-1).values
    return (top[..., 0] - top[..., 1]).tolist()


@torch.no_grad()
def route(gate, x, use_bias):
    """DeepseekV3TopkRouter's expert choice for rows x, with or without the correction bias;
    also the decision margins (top-k and group boundary of the biased choice scores)."""
    logits = torch.nn.functional.linear(x.float(), gate.weight.float())
    scores = logits.sigmoid()
    choice = scores + (gate.e_score_correction_bias if use_bias else 0.0)
    g = choice.view(-1, gate.num_group, gate.num_experts // gate.num_group)
    group_scores = g.topk(2, dim=-1)[0].sum(dim=-1)
    gs = torch.sort(group_scores, dim=-1, descending=True).values
    if gate.topk_group < gate.num_group:
        group_margin = gs[:, gate.topk_group - 1] - gs[:, gate.topk_group]
    else:  # every group kept (Kimi-K2: one group): no group decision to be near
        group_margin = torch.full_like(gs[:, 0], float("inf"))
    group_idx = torch.topk(group_scores, k=gate.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    mask = mask.unsqueeze(-1).expand_as(g).reshape(-1, gate.num_experts).bool()
    masked = choice.masked_fill(~mask, float("-inf"))
    srt = torch.sort(masked, dim=-1, descending=True).values
    k = gate.top_k
    topk_margin = srt[:, k - 1] - srt[:, k]
    chosen = torch.topk(masked, k=k, dim=-1, sorted=False)[1].sort(dim=-1).values
    return chosen, torch.minimum(group_margin, topk_margin)


@torch.no_grad()
def routing_stats(model, sequences):
    """Captures the MoE routers' inputs over the reference sequences; counts (token, layer)
    decisions that e_score_correction_bias changes, and the smallest decision margin."""
    captured = []

    def capture(module, args, output):
        captured.append((module, args[0].detach()))

    hooks = [
        layer.mlp.gate.register_forward_hook(capture)
        for layer in model.model.layers
        if hasattr(layer.mlp, "gate")
    ]
    with torch.no_grad():
        for seq in sequences:
            model(torch.tensor([seq]), use_cache=False)
    for h in hooks:
        h.remove()
    decisions = changed = 0
    min_margin = float("inf")
    for gate, x in captured:
        x = x.reshape(-1, x.shape[-1])
        with_bias, margin = route(gate, x, True)
        without, _ = route(gate, x, False)
        decisions += x.shape[0]
        changed += int((with_bias != without).any(dim=-1).sum())
        min_margin = min(min_margin, float(margin.min()))
    return dict(decisions=decisions, changed_by_bias=changed, min_decision_margin=min_margin)


def build(spec):
    name = spec["name"]
    out_dir = os.path.join(OUT_DIR, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    os.makedirs(REF_DIR, exist_ok=True)
    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = DeepseekV3Config(**spec["config"])
    cfg._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(cfg).float().eval()
    randomize(model, cfg, gen)
    if spec.get("pin_routing"):
        # e_score_correction_bias = 2 e: the choice (score + bias) always prefers the higher
        # experts by more than any score difference, so every token routes identically on every
        # backend (bf16 activations cannot flip a decision).
        with torch.no_grad():
            for buffer_name, b in model.named_buffers():
                if buffer_name.endswith("e_score_correction_bias"):
                    b.copy_(2.0 * torch.arange(b.numel(), dtype=b.dtype))

    # Write the checkpoint, then rebuild the float32 reference model from the written files so
    # it holds exactly the stored values (bf16-rounded or dequantized FP8).
    published = published_state(model, cfg)
    stored = stored_tensors(published, spec["fp8"])
    write_shards(stored, out_dir, spec["shards"])
    cj = config_json(cfg, spec["spelling"], spec["fp8"])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cj, f, indent=2)
        f.write("\n")
    back = read_back(out_dir)
    assert set(back) == set(published), set(back) ^ set(published)

    # The written config.json, read by transformers, gives the same model configuration.
    cfg2 = DeepseekV3Config.from_pretrained(out_dir)
    cfg2._attn_implementation = "eager"
    ref = DeepseekV3ForCausalLM(cfg2).float().eval()
    fused_state(back, ref)
    assert torch.equal(ref.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
    assert ref.model.layers[0].self_attn.scaling == model.model.layers[0].self_attn.scaling

    if not spec["fp8"]:
        # The published layout round-trips through transformers' own loader (which re-fuses
        # the per-expert tensors).
        loaded = DeepseekV3ForCausalLM.from_pretrained(
            out_dir, dtype=torch.float32, attn_implementation="eager"
        )
        sd_ref, sd_loaded = ref.state_dict(), loaded.state_dict()
        for k, v in sd_ref.items():
            assert torch.equal(v, sd_loaded[k]), f"{name}: {k} differs after from_pretrained"
        # And save_pretrained writes the same per-expert split as published_state.
        tmp = os.path.join(out_dir, "_save_pretrained")
        loaded.save_pretrained(tmp)
        with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
            for k in f.keys():
                assert torch.equal(f.get_tensor(k).float(), back[k]), f"{name}: save_pretrained {k}"
        shutil.rmtree(tmp)

    gen_prompts = torch.Generator().manual_seed(spec["seed"] + 1)
    prompts = [
        torch.randint(0, cfg.vocab_size, (n,), generator=gen_prompts).tolist()
        for n in spec["prompt_lengths"]
    ]
    records = []
    logits_out = {}
    hidden_out = {}
    # The residual stream after every decoder layer (the layers' outputs; transformers'
    # hidden_states[l + 1] before the final norm, which its last entry includes).
    captured = []

    def capture_layer(module, args, output):
        captured.append((output[0] if isinstance(output, tuple) else output)[0].float())

    hooks = [layer.register_forward_hook(capture_layer) for layer in ref.model.layers]
    for k, prompt in enumerate(prompts):
        cont = greedy(ref, prompt, N_GENERATE)
        seq = prompt + cont[:-1]
        captured.clear()
        with torch.no_grad():
            out = ref(torch.tensor([seq]), use_cache=False, output_hidden_states=True)
        logits = out.logits[0].float()
        assert len(captured) == cfg.num_hidden_layers
        for l in range(cfg.num_hidden_layers - 1):  # the hooks see what hidden_states holds
            assert torch.equal(captured[l], out.hidden_states[l + 1][0].float())
        hidden_out[f"prompt{k}"] = torch.stack(captured, dim=1).contiguous()  # [T, L, H]
        argmax = torch.argmax(logits, dim=-1).tolist()
        # The one-forward logits agree with the step-by-step greedy tokens.
        assert argmax[len(prompt) - 1 :] == cont, f"{name} prompt {k}: full forward != greedy"
        gaps = top2_gap(logits)
        logits_out[f"prompt{k}"] = logits.contiguous()
        records.append(
            dict(
                prompt=prompt,
                continuation=cont,
                # Greedy token after every position of prompt + continuation[:-1].
                argmax=argmax,
                top2_gap=gaps,
                max_abs_logit=[float(v) for v in logits.abs().max(dim=-1).values],
            )
        )
    for h in hooks:
        h.remove()
    path = os.path.join(REF_DIR, f"{name}_logits.safetensors")
    save_file(logits_out, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)
    path = os.path.join(REF_DIR, f"{name}_hidden.safetensors")
    save_file(hidden_out, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)

    attn = ref.model.layers[0].self_attn
    info = dict(
        name=name,
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        generator="tests/data/make_reference_checkpoints.py",
        seed=spec["seed"],
        config=cj,
        config_spelling="transformers-4/published (rope_theta, rope_scaling)"
        if spec["spelling"] == "v4"
        else "transformers-5 (rope_parameters)",
        weights="fp8 e4m3 128x128 blocks (references from the dequantized weights)"
        if spec["fp8"]
        else "bf16 (references from the bf16 values in float32)",
        n_generate=N_GENERATE,
        attention_softmax_scale=attn.scaling,
        rope_inv_freq=[float(v) for v in ref.model.rotary_emb.inv_freq],
        rope_attention_factor=float(ref.model.rotary_emb.attention_scaling),
        rope_interleave=bool(cfg2.rope_interleave),
        min_top2_gap=min(min(r["top2_gap"]) for r in records),
        prompts=records,
    )
    if cfg2.first_k_dense_replace < cfg2.num_hidden_layers:
        sequences = [r["prompt"] + r["continuation"][:-1] for r in records]
        info["routing"] = routing_stats(ref, sequences)
    with open(os.path.join(REF_DIR, f"{name}.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(
        f"{name}: checkpoint {size / 1024:.0f} KiB, softmax scale {attn.scaling:.6f}, "
        f"min top-2 gap {info['min_top2_gap']:.3g}, routing {info.get('routing')}"
    )


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    only = set(sys.argv[1:])  # checkpoint names to (re)build; none: all
    for spec in CHECKPOINTS:
        if not only or spec["name"] in only:
            build(spec)


if __name__ == "__main__":
    main()
