#!/usr/bin/env python3
"""Writes a DeepSeek-V3-layout FP8 checkpoint with the kimi-k2-attn preset's dimensions, for
timing the CUDA engine's FP8 weights (engine_bench --model=DIR --fp8_weights=true|false).

The preset's shapes (hidden 7168, 64 heads, q_lora 1536, kv_lora 512 + rope 64, nope 128,
v 128, dense SwiGLU MLP of intermediate 18432, vocab 32000), `--layers` decoder layers, every
one dense (first_k_dense_replace = layers), plain RoPE. Every Linear weight of the decoder
layers is stored as DeepSeek-V3 publishes FP8: float8_e4m3fn with a float32 `_scale_inv` per
128 x 128 block (scale_inv = amax / 448; kv_a_proj_with_mqa's 576 rows end in a partial
block); embeddings, norms and lm_head in bf16. The values are random (normal, std
1 / sqrt(fan_in), so activations stay O(1)): a timing model, not a language model.

Needs torch and safetensors (the GPU machine has both); uses the GPU when there is one.
  python3 bench/engine/make_fp8_checkpoint.py --out /tmp/kimi_fp8 --layers 4
With --shard_layers K the decoder layers go into files of K layers each
(model-0000i-of-0000n.safetensors + model.safetensors.index.json, as published checkpoints
are split): 61 layers are ~31 GB, what the loader benchmark reads.
"""

import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, Q_LORA, KV_LORA, ROPE, NOPE, V, INTER, VOCAB = (
    7168, 64, 1536, 512, 64, 128, 128, 18432, 32000)
BLOCK, FP8_MAX = 128, 448.0


def fp8_block(rows, cols, gen, dev):
    """A random [rows, cols] weight quantized per 128 x 128 block: (e4m3, scale_inv)."""
    w = torch.randn(rows, cols, generator=gen, device=dev) / math.sqrt(cols)
    br, bc = math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)
    pad = torch.zeros(br * BLOCK, bc * BLOCK, device=dev)
    pad[:rows, :cols] = w
    blocks = pad.view(br, BLOCK, bc, BLOCK)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(br * BLOCK, bc * BLOCK)
    return q[:rows, :cols].contiguous().cpu(), scale.float().cpu()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--shard_layers", type=int, default=0,
                    help="decoder layers per file (0: one model.safetensors)")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    t = {}
    bf16 = lambda *shape: (torch.randn(*shape, generator=gen, device=dev)  # noqa: E731
                           / math.sqrt(shape[-1])).to(torch.bfloat16).cpu()
    t["model.embed_tokens.weight"] = (torch.randn(VOCAB, HIDDEN, generator=gen, device=dev)
                                      .to(torch.bfloat16).cpu())
    t["model.norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    t["lm_head.weight"] = bf16(VOCAB, HIDDEN)
    linears = {
        "self_attn.q_a_proj": (Q_LORA, HIDDEN),
        "self_attn.q_b_proj": (HEADS * (NOPE + ROPE), Q_LORA),
        "self_attn.kv_a_proj_with_mqa": (KV_LORA + ROPE, HIDDEN),
        "self_attn.kv_b_proj": (HEADS * (NOPE + V), KV_LORA),
        "self_attn.o_proj": (HIDDEN, HEADS * V),
        "mlp.gate_proj": (INTER, HIDDEN),
        "mlp.up_proj": (INTER, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTER),
    }
    # Each file is written as it fills, so host memory holds one shard at a time.
    n = -(-args.layers // args.shard_layers) if args.shard_layers > 0 else 1
    files = ([f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
             if args.shard_layers > 0 else ["model.safetensors"])
    index = {}

    def flush():
        name = files[len(set(index.values()))]
        save_file(t, os.path.join(args.out, name), metadata={"format": "pt"})
        for k in t:
            index[k] = name
        t.clear()

    for l in range(args.layers):
        if args.shard_layers > 0 and l > 0 and l % args.shard_layers == 0:
            flush()
        p = f"model.layers.{l}."
        for name, (rows, cols) in linears.items():
            q, s = fp8_block(rows, cols, gen, dev)
            t[p + name + ".weight"] = q
            t[p + name + ".weight_scale_inv"] = s
        for norm, n in (("input_layernorm", HIDDEN), ("post_attention_layernorm", HIDDEN),
                        ("self_attn.q_a_layernorm", Q_LORA),
                        ("self_attn.kv_a_layernorm", KV_LORA)):
            t[p + norm + ".weight"] = torch.ones(n, dtype=torch.bfloat16)
    flush()
    if args.shard_layers > 0:
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": index}, f)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": args.layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "q_lora_rank": Q_LORA,
        "kv_lora_rank": KV_LORA,
        "qk_rope_head_dim": ROPE,
        "qk_nope_head_dim": NOPE,
        "v_head_dim": V,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "first_k_dense_replace": args.layers,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.827,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK]},
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in files)
    print(f"wrote {args.out}: {args.layers} layers, {len(files)} files, {total / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
