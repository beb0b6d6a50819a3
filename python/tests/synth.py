"""synth.py - small consistent dumps for the kit's tests, written with DumpWriter.

A 4-layer model (sliding + hash MoE, CSA, HCA, CSA; compress ratios 4 / 8) whose every probe holds values that obey
the schema's value rules: mHC pre in (0, 1), post in (0, 2), comb column-normalised, router ids distinct with
weights summing to routed_scaling_factor, indexer scores finite exactly at the visible entries and topk_idx their
true top-k, compressed entries for the whole run. Values come from a numpy generator seeded per (dataset, row), so
two writes of one spec agree bit for bit.
"""
import json

import numpy as np

from dsv4dump import DumpWriter, schema

DIGEST = "5eed" * 16


def config(n_layers=4, hidden=32, head_dim=16, index_head_dim=16, index_topk=4, n_experts=8, k_experts=2,
           vocab=64):
    types = ["sliding_attention"] + ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
                                     for i in range(1, n_layers)]
    return json.dumps({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": vocab,
        "hidden_size": hidden, "num_hidden_layers": n_layers, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": head_dim, "partial_rotary_factor": 8 / head_dim, "q_lora_rank": 16, "o_groups": 2,
        "o_lora_rank": 8, "sliding_window": 8, "layer_types": types,
        "mlp_layer_types": ["hash_moe"] + ["moe"] * (n_layers - 1),
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        "index_n_heads": 4, "index_head_dim": index_head_dim, "index_topk": index_topk, "n_routed_experts": n_experts,
        "n_shared_experts": 1, "num_experts_per_tok": k_experts, "moe_intermediate_size": 16,
        "routed_scaling_factor": 1.5, "norm_topk_prob": True, "hc_mult": 4, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 256, "beta_fast": 32,
                         "beta_slow": 1},
        "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1}, indent=1)


def rng(name, row, seed=7):
    h = seed
    for c in f"{name}#{row}".encode():
        h = (h * 1099511628211 + c) % (1 << 63)
    return np.random.default_rng(h)


def row_values(cfg, layer, probe, pos, last_pos):
    """A valid row of `probe` at `pos`."""
    name = schema.dataset_name(layer, probe)
    g = rng(name, pos)
    D, hc = cfg.hidden_size, cfg.hc_mult
    if probe.endswith("hc_pre"):
        return g.uniform(0.05, 0.95, hc)
    if probe.endswith("hc_post"):
        return g.uniform(0.1, 1.9, hc)
    if probe.endswith("hc_comb"):
        c = g.uniform(0.05, 1.0, (hc, hc))
        return c / c.sum(axis=0, keepdims=True)
    if probe in ("attn_in", "ffn_in", "attn_out", "ffn_out", "hc_head", "norm"):
        return g.normal(0, 1, D)
    if probe == "kv":
        return g.normal(0, 1, cfg.head_dim)
    if probe == "out":
        return g.normal(0, 1, (hc, D))
    if probe == "logits":
        return g.normal(0, 2, cfg.vocab_size)
    if probe == "router_ids":
        return g.permutation(cfg.n_routed_experts)[:cfg.num_experts_per_tok]
    if probe == "router_weights":
        w = g.uniform(0.1, 1, cfg.num_experts_per_tok)
        return w / w.sum() * cfg.routed_scaling_factor
    ratio = cfg.ratio[layer]
    vis = (pos + 1) // ratio
    if probe == "indexer_scores":
        s = np.full((last_pos + 1) // ratio, -np.inf)
        s[:vis] = rng(name, pos).permutation(vis) * 0.25 - 1.0  # distinct: no ties
        return s
    if probe == "topk_idx":
        s = row_values(cfg, layer, "indexer_scores", pos, last_pos)
        k = min(cfg.index_topk, vis)
        return np.argsort(-s[:vis], kind="stable")[:k]
    raise KeyError(probe)


def write(path, *, prompt_len=21, n_decode=11, positions=None, omit=(), cfg_json=None, producer="synth kit",
          digest=DIGEST, mode="forced"):
    """A complete dump (but the probes in `omit`, names like "kv" or "layers/1/kv") at `positions` (default all)."""
    cfg_json = cfg_json or config()
    cfg = schema.Config(cfg_json)
    T = prompt_len + n_decode
    tokens = rng("tokens", 0).integers(0, cfg.vocab_size, T)
    positions = list(range(T)) if positions is None else list(positions)
    last = positions[-1]
    with DumpWriter(path, config_json=cfg_json, weights_digest=digest, producer=producer, tokens=tokens,
                    prompt_len=prompt_len, mode=mode, positions=positions) as w:
        for name in schema.expected_probes(cfg):
            layer, probe = schema.split_dataset_name(name)
            if probe in omit or name in omit:
                continue
            p = schema.find_probe(layer, probe)
            if p.per_entry:
                n = T // cfg.ratio[layer]
                w.entries(layer, probe, np.stack([rng(name, e).normal(0, 1, cfg.dim(p.dims[0], layer, last))
                                                  for e in range(n)]) if n else np.zeros((0, 1)))
                continue
            for pos in positions:
                w.row(layer if layer >= 0 else None, probe, pos, row_values(cfg, layer, probe, pos, last))
    return cfg
