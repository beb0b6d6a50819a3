#!/usr/bin/env python3
"""make_golden.py - golden models and dsv4-dump/1 files from transformers' own DeepseekV4 (the oracle).

Builds small random DeepseekV4Configs, randomises EVERY parameter and buffer (the default init is degenerate:
tid2eid = 0, zero biases/sinks/position biases, mHC base 0 / scale 1, norms 1), saves the model folder with
save_pretrained (config.json + model.safetensors), runs a prefill and then one-token decode steps in fp32 on
the CPU with a DynamicCache, captures every probe of docs/dump-format.md with the hooks of the kit's transformers
adapter (python/dsv4dump/transformers.py), checks the cached decode against transformers' own no-cache forward over
the same tokens, and writes the dumps with the kit's DumpWriter (dump/writer.c's layout; temp name then rename).

Sets (each a folder under --out):
  tiny      every attention type and both MoE kinds; forced.h5 (forced decode) and greedy.h5 (32 greedy steps)
  topk512   index_topk = 512 with > 512 visible compressed entries at the decode positions
  tiny-fp8  the tiny weights re-saved under the OFFICIAL checkpoint names, FP8 e4m3 128x128 block-scaled
            linears (ue8m0 scales), FP4 e2m1 routed experts (e8m0 scale per 32); its forced.h5 is computed
            by transformers on the weights dequantised from that file
  random-S  (--random-arch S,...) an architecture DRAWN from seed S (random_arch below: layer order and types,
            compress ratios, window, index_topk and heads, head and rope dims, experts, routed scale 1-3,
            Sinkhorn iterations, SwiGLU limits that act, hash layers, a prompt ending on or off the compressor
            boundaries) with its forced.h5 (every position stored) and arch.json (what was drawn). Models no
            tolerance constant was fitted to, for the baseline verdicts (docs/verify.md "Baseline mode")

Usage (needs torch, transformers >= 5.8 with deepseek_v4, h5py, numpy, and python/dsv4dump of this repository, which
it finds by itself; runs on the CPU):
  python3 golden/make_golden.py --set all --out golden          # every set
  python3 golden/make_golden.py --set tiny --out /tmp/repro     # one set
  python3 golden/make_golden.py --compare golden/tiny /tmp/repro/tiny   # bit-for-bit probe comparison
  python3 golden/make_golden.py --random-arch 101-110 --out /tmp/random  # drawn architectures random-101..110
  python3 golden/make_golden.py --random-arch 3 --describe               # what seed 3 draws (no torch needed)
golden/regen_on_device.sh runs all of this on the device machine (see golden/README.md);
golden/adapter_check_on_device.sh regenerates every committed set into a temporary folder and compares each.
Every check that fails raises: a set whose checks fail is left as <set>.failed, never under its name.
"""
import argparse
import copy
import hashlib
import json
import math
import os
import random
import shlex
import shutil
import struct
import sys
import time
import traceback
from collections import Counter, defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from dsv4dump.transformers import Capture, run_sequence  # noqa: E402  (the repository's kit, torch imported lazily)
from dsv4dump.writer import DumpWriter  # noqa: E402

SCHEMA = "dsv4-dump/1"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
SLIDING = "sliding_attention"
ATTN_NAME = {SLIDING: "sliding", CSA: "csa", HCA: "hca"}
NOCACHE_TOL = 1e-5  # max|cached - nocache| / max|nocache| on the logits


class GoldenError(RuntimeError):
    pass


def need(cond, msg):
    if not cond:
        raise GoldenError(msg)


def log(msg=""):
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------------ sets
def yarn():
    return {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256,
            "beta_fast": 32.0, "beta_slow": 1.0}


def tiny_config():
    # model-spec §15(b) recipe, widened where it buys coverage: 6 heads (q_b out = 192: two 128-row FP8
    # blocks, the second partial), q_lora_rank 136 (two 128-column blocks, the second partial), swiglu_limit
    # 2 so the SwiGLU clamps act on a few per cent of the values. Layers: every attention type with both
    # MoE kinds: sliding+hash, CSA+hash, HCA+moe, CSA+moe, HCA+moe, sliding+moe.
    return dict(
        vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=6,
        num_attention_heads=6, num_key_value_heads=1, head_dim=32, q_lora_rank=136,
        partial_rotary_factor=0.25, num_experts_per_tok=3, n_routed_experts=8, n_shared_experts=1,
        layer_types=[SLIDING, CSA, HCA, CSA, HCA, SLIDING],
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
        compress_rates={CSA: 4, HCA: 8}, sliding_window=8, o_groups=2, o_lora_rank=16,
        index_n_heads=16, index_head_dim=16, index_topk=4, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        rms_norm_eps=1e-6, max_position_embeddings=4096, rope_theta=10000.0, compress_rope_theta=160000.0,
        swiglu_limit=2.0, routed_scaling_factor=1.5, scoring_func="sqrtsoftplus", norm_topk_prob=True,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, rope_scaling=yarn(),
    )


def topk512_config():
    # Tiny widths, long context: two CSA layers rank > 512 visible entries with index_topk = 512.
    return dict(
        vocab_size=256, hidden_size=32, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, q_lora_rank=16,
        partial_rotary_factor=0.5, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
        layer_types=[SLIDING, CSA, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        compress_rates={CSA: 4, HCA: 16}, sliding_window=32, o_groups=2, o_lora_rank=8,
        index_n_heads=16, index_head_dim=16, index_topk=512, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        rms_norm_eps=1e-6, max_position_embeddings=4096, rope_theta=10000.0, compress_rope_theta=160000.0,
        swiglu_limit=10.0, routed_scaling_factor=1.5, scoring_func="sqrtsoftplus", norm_topk_prob=True,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, rope_scaling=yarn(),
    )


TINY = dict(seed=1234, prompt_len=21, n_decode=43, n_greedy=32)
TOPK512 = dict(seed=5120, prompt_len=2296, n_decode=16)


# ------------------------------------------------------------------------------------------------ torch side
def import_torch():
    global torch, F, transformers, mdv4, DynamicCache, DeepseekV4Config, DeepseekV4ForCausalLM
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import DynamicCache
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdv4
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    DeepseekV4ForCausalLM = mdv4.DeepseekV4ForCausalLM
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True, warn_only=True)
    need(hasattr(mdv4, "apply_rotary_pos_emb"), "modeling_deepseek_v4.apply_rotary_pos_emb is gone")


def versions():
    return transformers.__version__, torch.__version__.split("+")[0]


def randomise(model, seed):
    """Every parameter and buffer gets a deterministic, non-degenerate value of sane magnitude."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    done = []
    for name in sorted(params):
        p = params[name]
        shape = tuple(p.shape)
        randn = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith(".sinks"):
            v = randn
        elif name.endswith("position_bias"):
            v = 0.5 * randn
        elif name.endswith("attn_hc.fn") or name.endswith("ffn_hc.fn") or name.endswith("hc_head.hc_fn"):
            v = randn / math.sqrt(shape[1])
        elif name.endswith("hc.base") or name.endswith("hc_head.hc_base"):
            v = 0.5 * randn
        elif name.endswith("hc.scale") or name.endswith("hc_head.hc_scale"):
            v = 0.5 + torch.rand(shape, generator=g, dtype=torch.float32)
        elif name.endswith("norm.weight"):
            need(len(shape) == 1, f"{name}: norm weight of shape {shape}")
            v = 1.0 + 0.1 * randn
        elif name.endswith("embed_tokens.weight"):
            v = randn
        elif name.endswith("experts.gate_up_proj"):
            v = randn / math.sqrt(shape[2])
        elif name.endswith("experts.down_proj"):
            v = randn / math.sqrt(shape[2])
        elif name.endswith(".weight") and len(shape) == 2:
            v = randn / math.sqrt(shape[1])
        else:
            raise GoldenError(f"randomise: no rule for parameter {name} {shape}")
        with torch.no_grad():
            p.copy_(v)
        done.append(name)
    for name in sorted(buffers):
        b = buffers[name]
        if name.endswith("inv_freq"):
            continue  # RoPE tables, derived from the config (non-persistent)
        if name.endswith("tid2eid"):
            V, k = b.shape
            E = cfg.n_routed_experts
            need(k == cfg.num_experts_per_tok and k <= E, f"{name}: shape {tuple(b.shape)}")
            t = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(V)]).to(b.dtype)
            with torch.no_grad():
                b.copy_(t)
        elif name.endswith("e_score_correction_bias"):
            with torch.no_grad():
                b.copy_(0.3 * torch.randn(tuple(b.shape), generator=g, dtype=torch.float32))
        else:
            raise GoldenError(f"randomise: no rule for buffer {name} {tuple(b.shape)}")
        done.append(name)
    return done


def nested_rope(kw):
    rs = kw["rope_scaling"]
    prf = kw["partial_rotary_factor"]
    return {"main": {"rope_type": "default", "rope_theta": kw["rope_theta"], "partial_rotary_factor": prf},
            "compress": {"rope_type": "yarn", "rope_theta": kw["compress_rope_theta"], "factor": rs["factor"],
                         "original_max_position_embeddings": rs["original_max_position_embeddings"],
                         "beta_fast": rs["beta_fast"], "beta_slow": rs["beta_slow"],
                         "partial_rotary_factor": prf, "attention_factor": 1.0}}


def make_config(kw):
    """The model-spec §15(b) way (legacy rope_scaling); if that does not give a YaRN compress rope here,
    the nested rope_parameters that a saved config.json carries."""
    try:
        cfg = DeepseekV4Config(**kw)
        if cfg.rope_parameters.get("compress", {}).get("rope_type") == "yarn":
            return cfg
        log(f"note: rope_scaling gave rope_parameters {cfg.rope_parameters}; passing them nested instead")
    except (TypeError, ValueError) as e:
        log(f"note: DeepseekV4Config(rope_scaling=...) failed ({e}); passing rope_parameters nested instead")
    kw2 = {k: v for k, v in kw.items() if k != "rope_scaling"}
    kw2["rope_parameters"] = nested_rope(kw)
    return DeepseekV4Config(**kw2)


def build_model(cfg_kwargs, seed, show=False):
    cfg = make_config(cfg_kwargs)
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomise(model, seed)
    check_model(model, cfg_kwargs, show)
    return model


ARCH_KEYS = ("rope_parameters", "layer_types", "mlp_layer_types", "compress_rates", "qk_rope_head_dim")


def check_model(model, kw, show):
    cfg = model.config
    for k, v in kw.items():
        if k == "rope_scaling":
            continue
        got = getattr(cfg, k, None)
        if got is None and v is not None:
            log(f"note: config has no attribute {k} (asked for {v!r})")
            continue
        need(got == v, f"config {k} = {got!r}, asked for {v!r}")
    need(cfg.qk_rope_head_dim == int(kw["head_dim"] * kw["partial_rotary_factor"]),
         f"qk_rope_head_dim {cfg.qk_rope_head_dim}")
    rp = cfg.rope_parameters
    need(isinstance(rp, dict) and "main" in rp and "compress" in rp, f"rope_parameters = {rp}")
    need(rp["compress"].get("rope_type") == "yarn", f"compress rope is not yarn: {rp['compress']}")
    need(float(rp["compress"].get("attention_factor", -1)) == 1.0, f"compress attention_factor: {rp['compress']}")
    need(model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "lm_head tied to embed")
    if show:
        log(f"config: layer_types={cfg.layer_types} mlp_layer_types={cfg.mlp_layer_types} "
            f"compress_rates={cfg.compress_rates} qk_rope_head_dim={cfg.qk_rope_head_dim}")
        log(f"config: rope_parameters={rp}")
        log(f"config: experts implementation={getattr(cfg, '_experts_implementation', None)} "
            f"attn implementation={getattr(cfg, '_attn_implementation', None)}")
        log("module tree:")
        log(str(model))
    # The RoPE tables against model-spec §3 (informative: the reference implements the spec formula).
    rot = model.model.rotary_emb
    for kind in ("main", "compress"):
        inv = getattr(rot, f"{kind}_inv_freq", None)
        need(inv is not None, f"rotary_emb has no {kind}_inv_freq")
        try:
            ref = spec_inv_freq(cfg, kind)
            rel = float(np.max(np.abs(inv.double().numpy() - ref) / ref))
            log(f"rope {kind}: {inv.numel()} frequencies, max rel diff to model-spec §3 formula {rel:.3g}")
        except Exception as e:
            log(f"note: rope {kind}: could not evaluate the model-spec formula ({type(e).__name__}: {e})")


def spec_inv_freq(cfg, kind):
    dim = cfg.qk_rope_head_dim
    i = np.arange(dim // 2, dtype=np.float64)
    if kind == "main":
        return cfg.rope_theta ** (-2 * i / dim)
    p = cfg.rope_parameters["compress"]
    b, s, L0 = p["rope_theta"], p["factor"], p["original_max_position_embeddings"]
    th = b ** (-2 * i / dim)

    def c(beta):
        return dim * math.log(L0 / (2 * math.pi * beta)) / (2 * math.log(b))

    lo = max(math.floor(c(p["beta_fast"])), 0)
    hi = min(math.ceil(c(p["beta_slow"])), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((i - lo) / (hi - lo), 0, 1)
    return th * ramp / s + th * (1 - ramp)


# ------------------------------------------------------------------------------------------------ probes
# The probes: dsv4dump.transformers.Capture (python/dsv4dump/transformers.py) is the hooks this generator used to
# hold as its Recorder, moved unchanged into the kit (with run_sequence) so that other users of transformers get the
# same rows; the committed sets are its test (golden/adapter_check_on_device.sh regenerates them bit for bit).


def nocache_check(model, rec, tokens, cached_logits, store, label):
    rec.mode = "nocache"
    rec.nocache_topk = {}
    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens], dtype=torch.long), use_cache=False)
    rec.mode = "off"
    nc = out.logits[0].float()
    need(nc.shape == cached_logits.shape, f"no-cache logits {tuple(nc.shape)} vs {tuple(cached_logits.shape)}")
    need(bool(torch.isfinite(nc).all()), f"{label}: non-finite no-cache logits")
    diff = (cached_logits - nc).abs()
    rel = float(diff.max() / nc.abs().max())
    worst = int(diff.max(dim=1).values.argmax())
    std = float(nc.std())
    # topk agreement cached vs no-cache at the stored positions (diagnostic)
    same = total = 0
    for L, topk in rec.nocache_topk.items():
        rows = rec.rows.get(f"layers/{L}/topk_idx", {})
        for p, row in rows.items():
            a = set(int(x) for x in row if x >= 0)
            b = set(int(x) for x in topk[p] if x >= 0)
            total += 1
            same += a == b
    log(f"  {label}: cached vs no-cache logits: max|diff| {float(diff.max()):.3g}, max|logit| "
        f"{float(nc.abs().max()):.3g}, relative {rel:.3g} (worst position {worst}); logit std {std:.3g}; "
        f"top-k sets identical {same}/{total}")
    if rel > NOCACHE_TOL:
        per = (diff.max(dim=1).values / nc.abs().max()).tolist()
        log(f"  {label}: positions over tolerance: " + ", ".join(f"{p}:{v:.2g}" for p, v in enumerate(per)
                                                              if v > NOCACHE_TOL)[:2000])
    need(rel <= NOCACHE_TOL, f"{label}: cached decode differs from the no-cache forward: relative {rel:.3g} "
         f"> {NOCACHE_TOL}")
    need(0.1 <= std <= 10.0, f"{label}: logit std {std:.3g} is not of order 1")
    return rel


def check_final_state(rec, cache, cfg, T, label):
    """The captured pools and window kv against the cache's own state (catches a hook on the wrong tensor)."""
    for L, lt in enumerate(cfg.layer_types):
        cl = cache.layers[L] if hasattr(cache, "layers") else None
        if lt != SLIDING:
            r = cfg.compress_rates[lt]
            got = rec.entries.get(f"layers/{L}/compressed_kv")
            need(got is not None and got.shape[0] == T // r,
                 f"{label} layer {L}: compressed_kv has {None if got is None else got.shape[0]} rows, "
                 f"expected {T // r}")
            pools = getattr(cl, "compressed_kv", None)
            if isinstance(pools, dict) and pools.get("compressor") is not None:
                need(np.array_equal(pools["compressor"][0].float().numpy(), got),
                     f"{label} layer {L}: compressed_kv differs from the cache's pool")
        if lt == CSA:
            got = rec.entries.get(f"layers/{L}/indexer_kv")
            need(got is not None and got.shape[0] == T // cfg.compress_rates[CSA],
                 f"{label} layer {L}: indexer_kv rows")
            pools = getattr(cl, "compressed_kv", None)
            if isinstance(pools, dict) and pools.get("indexer") is not None:
                need(np.array_equal(pools["indexer"][0].float().numpy(), got),
                     f"{label} layer {L}: indexer_kv differs from the cache's indexer pool")
        keys = getattr(cl, "keys", None)
        if keys is not None and keys.dim() == 4:
            n = keys.shape[2]
            kvrows = rec.rows[f"layers/{L}/kv"]
            ps = list(range(T - n, T))
            if all(p in kvrows for p in ps):
                mine = np.stack([kvrows[p] for p in ps])
                need(np.array_equal(keys[0, 0].float().numpy(), mine),
                     f"{label} layer {L}: kv probe differs from the cache's window keys")
            else:
                log(f"  note: layer {L} window keys not all stored; cache cross-check skipped")
        else:
            log(f"  note: layer {L}: cache has no keys tensor; kv cross-check skipped")


# ------------------------------------------------------------------------------------------------ HDF5
def write_dump(path, *, cfg, config_json, digest, tokens, prompt_len, n_decode, mode, positions, rec, seed, label,
               rel):
    """The dump through the kit's DumpWriter (dump/writer.c's layout, temp name then rename): every probe of the
    schema at every stored position (rec.write refuses a missing row), plus this generator's root attributes."""
    tv, pv = versions()
    T = len(tokens)
    need(T == prompt_len + n_decode, "token count")
    attrs = {"transformers_version": tv, "torch_version": pv, "seed": str(seed),
             "command": shlex.join([os.path.basename(sys.executable)] + sys.argv), "golden_set": label,
             "nocache_rel_diff": f"{rel:.6g}"}
    with DumpWriter(path, config_json=config_json, weights_digest=digest, producer=f"transformers {tv} fp32 cpu",
                    tokens=tokens, prompt_len=prompt_len, mode=mode, positions=sorted(positions), attrs=attrs) as w:
        need(w.cfg.attention == [ATTN_NAME[t] for t in cfg.layer_types], f"{path}: config.json's layer types")
        rec.write(w)


def validate_rows(model, rec, tokens, positions, label):
    """What the C test checks, checked here first on the captured rows (a failure here is a hook bug)."""
    cfg = model.config
    K, r4 = cfg.index_topk, cfg.compress_rates[CSA]
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    trailing = True
    for L, lt in enumerate(cfg.layer_types):
        gate = model.model.layers[L].mlp.gate
        tid2eid = gate.tid2eid.numpy() if cfg.mlp_layer_types[L] == "hash_moe" else None
        for p in positions:
            ids = rec.rows[f"layers/{L}/router_ids"][p]
            w = rec.rows[f"layers/{L}/router_weights"][p]
            need(len(set(ids.tolist())) == k and ids.min() >= 0 and ids.max() < E, f"{label} L{L} p{p}: ids {ids}")
            need(abs(float(w.sum()) - cfg.routed_scaling_factor) < 1e-5 and w.min() > 0,
                 f"{label} L{L} p{p}: router weights {w} do not sum to {cfg.routed_scaling_factor}")
            if tid2eid is not None:
                need(sorted(ids.tolist()) == sorted(tid2eid[tokens[p]].tolist()),
                     f"{label} L{L} p{p}: hash ids {ids} != tid2eid[{tokens[p]}]")
            for which in ("attn", "ffn"):
                comb = rec.rows[f"layers/{L}/{which}_hc_comb"][p]
                need(np.all(np.abs(comb.sum(0) - 1) < 1e-4), f"{label} L{L} p{p}: {which} comb column sums")
            if lt != CSA:
                continue
            sc = rec.rows[f"layers/{L}/indexer_scores"][p]
            picks = rec.rows[f"layers/{L}/topk_idx"][p].astype(np.int64)
            vis = (p + 1) // r4
            valid = picks[picks >= 0]
            if np.any(picks < 0):
                first = int(np.argmax(picks < 0))
                trailing &= bool(np.all(picks[first:] < 0))
            need(len(set(valid.tolist())) == len(valid) == min(K, vis), f"{label} L{L} p{p}: "
                 f"{len(valid)} distinct valid picks of {len(picks)}, expected min({K}, {vis})")
            need(valid.size == 0 or valid.max() < vis, f"{label} L{L} p{p}: pick beyond the visible entries")
            need(np.all(np.isfinite(sc[:vis])) and np.all(np.isneginf(sc[vis:])), f"{label} L{L} p{p}: scores")
            rest = np.setdiff1d(np.arange(vis), valid)
            if rest.size and valid.size:
                need(sc[valid].min() >= sc[rest].max(), f"{label} L{L} p{p}: picks are not the top scores")
    log(f"  {label}: router, mHC comb and top-k rows valid; -1 only as trailing padding: {trailing}")


def probe_summary(rec, cfg, positions):
    for L, lt in enumerate(cfg.layer_types):
        parts = []
        for probe in ("attn_in", "kv", "attn_out", "ffn_out", "out"):
            rows = rec.rows[f"layers/{L}/{probe}"]
            a = np.stack([rows[p] for p in positions])
            parts.append(f"{probe} std {a.std():.3g} max {np.abs(a).max():.3g}")
        log(f"  layer {L} {ATTN_NAME[lt]:7s}: " + "; ".join(parts))


# ------------------------------------------------------------------------------------------------ model folders
def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_and_reload(model, folder, kw):
    model.save_pretrained(folder)
    # save_pretrained writes only the keys that differ from the class defaults; the golden config.json is
    # complete, so that no reader has to know transformers' defaults.
    model.config.to_json_file(os.path.join(folder, "config.json"), use_diff=False)
    files = sorted(os.listdir(folder))
    log(f"  saved {folder}: {files}")
    need("model.safetensors" in files and "config.json" in files, f"save_pretrained wrote {files}")
    need(not any(f.endswith(".index.json") for f in files), "save_pretrained sharded the model")
    try:
        again = DeepseekV4ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    except Exception as e:
        log(f"  WARNING: from_pretrained failed ({type(e).__name__}: {e}); checking the saved tensors by content")
        content_check(model, os.path.join(folder, "model.safetensors"))
        return model
    a = dict(model.named_parameters()); a.update(dict(model.named_buffers()))
    b = dict(again.named_parameters()); b.update(dict(again.named_buffers()))
    need(sorted(a) == sorted(b), f"reloaded model has other tensors: {sorted(set(a) ^ set(b))[:8]}")
    bad = [n for n in a if a[n].dtype != b[n].dtype or not torch.equal(a[n], b[n])]
    need(not bad, f"save_pretrained -> from_pretrained changed {len(bad)} tensors, e.g. {bad[:6]}")
    log(f"  save_pretrained -> from_pretrained round trip: {len(a)} tensors identical")
    for k in [k for k in kw if k != "rope_scaling"] + list(ARCH_KEYS):
        need(getattr(again.config, k, None) == getattr(model.config, k, None),
             f"config {k} changed in the round trip: {getattr(model.config, k, None)!r} -> "
             f"{getattr(again.config, k, None)!r}")
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    dtypes = Counter(v["dtype"] for k, v in header.items() if k != "__metadata__")
    log(f"  model.safetensors: {len(header) - 1} tensors, dtypes {dict(dtypes)}, "
        f"metadata {header.get('__metadata__')}; e.g. {sorted(k for k in header if k != '__metadata__')[:4]}")
    return again


def content_check(model, path):
    """Every tensor in the saved file equals a state-dict tensor (or one expert's slice of a fused one), and
    every state-dict element is covered, whatever the names."""
    from safetensors.torch import load_file

    def key(t):
        t = t.detach().contiguous()
        return (str(t.dtype), tuple(t.shape), hashlib.sha1(t.view(-1).view(torch.uint8).numpy().tobytes())
                .hexdigest())

    I = model.config.moe_intermediate_size
    pool, need_n = {}, 0
    for n, t in model.state_dict().items():
        need_n += t.numel()
        if n.endswith("experts.gate_up_proj"):
            for e in range(t.shape[0]):
                pool[key(t[e, :I])] = n
                pool[key(t[e, I:])] = n
        elif n.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                pool[key(t[e])] = n
        else:
            pool[key(t)] = n
    saved = load_file(path)
    miss = [k for k, v in saved.items() if key(v) not in pool]
    need(not miss, f"saved tensors matching no model tensor: {miss[:6]}")
    got_n = sum(v.numel() for v in saved.values())
    need(got_n == need_n, f"saved {got_n} elements, the model has {need_n}")
    log(f"  content check: {len(saved)} saved tensors all equal model tensors ({got_n} elements)")


def make_tokens(seed, n, vocab):
    g = torch.Generator().manual_seed(seed + 1)
    return [int(x) for x in torch.randint(0, vocab, (n,), generator=g)]


def finish_set(tmpdir, final, ok):
    dest = final if ok else final + ".failed"
    for d in (final, final + ".failed"):
        if os.path.exists(d):
            shutil.rmtree(d)
    os.replace(tmpdir, dest)
    total = 0
    for fn in sorted(os.listdir(dest)):
        sz = os.path.getsize(os.path.join(dest, fn))
        total += sz
        log(f"  {dest}/{fn}: {sz} bytes")
    log(f"  {dest}: {total} bytes in all{'' if ok else ' (FAILED: checks did not pass)'}")
    return dest


def fresh_dir(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def dump_sequence(model, rec, folder, fname, *, prompt, forced, n_decode, mode, store_fn, seed, label):
    cfg = model.config
    t0 = time.time()
    tokens, logits, cache = run_sequence(model, rec, prompt, forced, n_decode, mode,
                                         store_fn(len(prompt), n_decode))
    T = len(tokens)
    positions = sorted(store_fn(len(prompt), n_decode))
    t1 = time.time()
    check_final_state(rec, cache, cfg, T, label)
    rel = nocache_check(model, rec, tokens, logits, positions, label)
    need(bool(torch.isfinite(logits).all()), f"{label}: non-finite logits")
    probe_summary(rec, cfg, positions)
    validate_rows(model, rec, tokens, positions, label)
    if mode == "greedy":
        fed = tokens[len(prompt):]
        arg = [int(torch.argmax(logits[p - 1])) for p in range(len(prompt), T)]
        need(fed == arg, f"{label}: greedy tokens are not the argmax of the previous logits")
    with open(os.path.join(folder, "config.json")) as f:
        config_json = f.read()
    digest = sha256_file(os.path.join(folder, "model.safetensors"))
    write_dump(os.path.join(folder, fname), cfg=cfg, config_json=config_json, digest=digest, tokens=tokens,
               prompt_len=len(prompt), n_decode=n_decode, mode=mode, positions=positions, rec=rec, seed=seed,
               label=label, rel=rel)
    log(f"  {label}: {T} tokens, {len(positions)} stored positions, run {t1 - t0:.1f}s, "
        f"checks+write {time.time() - t1:.1f}s -> {fname}")
    return rel


def all_positions(P, n):
    return list(range(P + n))


def last_prefill_and_decode(P, n):
    return [P - 1] + list(range(P, P + n))


# ------------------------------------------------------------------------------------------------ the sets
def gen_tiny(out, results):
    s = TINY
    model = build_model(tiny_config(), s["seed"], show=True)
    folder = os.path.join(out, "tiny")
    tmp = folder + ".tmp"
    fresh_dir(tmp)
    ok = False
    try:
        model = save_and_reload(model, tmp, tiny_config())
        rec = Capture(model, log=log)
        rec.describe()
        V = model.config.vocab_size
        P, n = s["prompt_len"], s["n_decode"]
        forced = make_tokens(s["seed"], P + n, V)
        results["tiny/forced.h5"] = dump_sequence(
            model, rec, tmp, "forced.h5", prompt=forced[:P], forced=forced, n_decode=n, mode="forced",
            store_fn=all_positions, seed=s["seed"], label="tiny forced")
        results["tiny/greedy.h5"] = dump_sequence(
            model, rec, tmp, "greedy.h5", prompt=forced[:P], forced=None, n_decode=s["n_greedy"],
            mode="greedy", store_fn=all_positions, seed=s["seed"], label="tiny greedy")
        rec.remove()
        ok = True
    finally:
        finish_set(tmp, folder, ok)
    return model, forced


def gen_topk512(out, results):
    s = TOPK512
    model = build_model(topk512_config(), s["seed"])
    folder = os.path.join(out, "topk512")
    tmp = folder + ".tmp"
    fresh_dir(tmp)
    ok = False
    try:
        model = save_and_reload(model, tmp, topk512_config())
        rec = Capture(model, log=log)
        P, n = s["prompt_len"], s["n_decode"]
        forced = make_tokens(s["seed"], P + n, model.config.vocab_size)
        results["topk512/forced.h5"] = dump_sequence(
            model, rec, tmp, "forced.h5", prompt=forced[:P], forced=forced, n_decode=n, mode="forced",
            store_fn=last_prefill_and_decode, seed=s["seed"], label="topk512 forced")
        vis = [(p + 1) // 4 for p in range(P, P + n)]
        need(min(vis) > 512, f"topk512: decode positions see only {min(vis)} entries")
        log(f"  topk512: decode positions see {min(vis)}..{max(vis)} compressed entries (index_topk 512)")
        ok = True
    finally:
        finish_set(tmp, folder, ok)


# ---- drawn architectures (--random-arch)
def random_arch(seed):
    """An architecture drawn from `seed` (Python's own Mersenne Twister, so the draw needs no torch and is the
    same on every machine): (config kwargs, run parameters). Every choice stays inside what transformers'
    DeepseekV4 and both dsv4 paths accept (1 KV head, hc_mult 4, even rope dim <= index_head_dim, heads divisible
    by o_groups, head dims multiples of 16 for the tensor-core kernels, sqrtsoftplus routing) and small enough
    that a model and its dump stay a few MB."""
    rng = random.Random(f"dsv4-random-arch-{seed}")
    n_layers = rng.randint(3, 7)
    types = [rng.choice([SLIDING, CSA, HCA]) for _ in range(n_layers)]
    csa_at, hca_at = rng.sample(range(n_layers), 2)  # every model has both compressed kinds, anywhere
    types[csa_at], types[hca_at] = CSA, HCA
    n_hash = rng.randint(0, min(3, n_layers - 1))  # hash-routed layers come first, as in the checkpoint
    head_dim = rng.choice([32, 64])
    index_head_dim = rng.choice([16, 32])
    rope_dim = rng.choice([r for r in (8, 16) if r <= min(head_dim, index_head_dim)])
    heads = rng.choice([2, 4, 6, 8])
    o_groups = rng.choice([g for g in (1, 2, 4) if heads % g == 0])
    n_routed = rng.choice([4, 8, 16])
    csa_rate = rng.choice([2, 4, 4, 8])
    hca_rate = rng.choice([8, 16, 32])
    kw = dict(
        vocab_size=rng.choice([192, 256, 320]), hidden_size=rng.choice([32, 64, 96]),
        moe_intermediate_size=rng.choice([32, 64]) if n_routed < 16 else 32, num_hidden_layers=n_layers,
        num_attention_heads=heads, num_key_value_heads=1, head_dim=head_dim, q_lora_rank=rng.choice([16, 48, 136]),
        partial_rotary_factor=rope_dim / head_dim, num_experts_per_tok=rng.randint(2, min(6, n_routed - 1)),
        n_routed_experts=n_routed, n_shared_experts=1, layer_types=types,
        mlp_layer_types=["hash_moe"] * n_hash + ["moe"] * (n_layers - n_hash),
        compress_rates={CSA: csa_rate, HCA: hca_rate}, sliding_window=rng.choice([4, 8, 16, 32]),
        o_groups=o_groups, o_lora_rank=rng.choice([8, 16, 32]), index_n_heads=rng.choice([4, 8, 16]),
        index_head_dim=index_head_dim, index_topk=rng.choice([2, 4, 8, 16]), hc_mult=4,
        hc_sinkhorn_iters=rng.randint(3, 20), hc_eps=1e-6, rms_norm_eps=1e-6, max_position_embeddings=4096,
        rope_theta=10000.0, compress_rope_theta=160000.0,
        # pre-activations are about N(0, 1): a limit of 1.5..3 clamps a few per cent of them
        swiglu_limit=round(rng.uniform(1.5, 3.0), 2), routed_scaling_factor=round(rng.uniform(1.0, 3.0), 2),
        scoring_func="sqrtsoftplus", norm_topk_prob=True, tie_word_embeddings=False, bos_token_id=0,
        eos_token_id=1, rope_scaling=yarn(),
    )
    # the prompt ends on a boundary of both compressors (a multiple of the larger rate, a power of two like the
    # smaller) for even seeds, off the CSA boundary (so partial windows carry into decode) for odd ones
    on_boundary = seed % 2 == 0
    if on_boundary:
        prompt_len = hca_rate * rng.randint(max(1, 24 // hca_rate), max(1, 80 // hca_rate))
    else:
        prompt_len = rng.randint(20, 80)
        while prompt_len % csa_rate == 0:
            prompt_len += 1
    run = dict(seed=seed, prompt_len=prompt_len, n_decode=rng.randint(8, 24), on_boundary=on_boundary)
    return kw, run


def parse_seeds(text):
    """"3", "1,4,9", "101-110" or mixtures -> sorted distinct non-negative seeds."""
    seeds = set()
    for part in text.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        need(lo.isdigit() and (not hi or hi.isdigit()), f"--random-arch: '{part}' is not a seed or a range A-B")
        a, b = int(lo), int(hi or lo)
        need(a <= b and b - a < 10000, f"--random-arch: range '{part}'")
        seeds.update(range(a, b + 1))
    return sorted(seeds)


def describe_arch(kw, run):
    types = "".join({SLIDING: "S", CSA: "C", HCA: "H"}[t] for t in kw["layer_types"])
    hashes = sum(t == "hash_moe" for t in kw["mlp_layer_types"])
    return (f"layers {types} (hash {hashes}), rates {kw['compress_rates'][CSA]}/{kw['compress_rates'][HCA]}, "
            f"window {kw['sliding_window']}, D {kw['hidden_size']}, heads {kw['num_attention_heads']}x"
            f"{kw['head_dim']} (rope {int(kw['head_dim'] * kw['partial_rotary_factor'])}), o {kw['o_groups']}x"
            f"{kw['o_lora_rank']}, q_lora {kw['q_lora_rank']}, indexer {kw['index_n_heads']}x{kw['index_head_dim']} "
            f"top-{kw['index_topk']}, experts {kw['n_routed_experts']} top-{kw['num_experts_per_tok']} x "
            f"{kw['moe_intermediate_size']}, scale {kw['routed_scaling_factor']}, sinkhorn {kw['hc_sinkhorn_iters']}, "
            f"swiglu {kw['swiglu_limit']}, vocab {kw['vocab_size']}; prompt {run['prompt_len']} "
            f"({'on' if run['on_boundary'] else 'off'} the compressor boundaries) + {run['n_decode']} decode")


def gen_random(out, results, seed):
    kw, run = random_arch(seed)
    name = f"random-{seed}"
    log(f"  {name}: {describe_arch(kw, run)}")
    model = build_model(kw, seed)
    folder = os.path.join(out, name)
    tmp = folder + ".tmp"
    fresh_dir(tmp)
    ok = False
    try:
        model = save_and_reload(model, tmp, kw)
        with open(os.path.join(tmp, "arch.json"), "w") as f:
            f.write(json.dumps({"seed": seed, "drawn": {k: v for k, v in kw.items() if k != "rope_scaling"},
                                "run": run, "summary": describe_arch(kw, run)}, indent=2, sort_keys=True) + "\n")
        rec = Capture(model, log=log)
        P, n = run["prompt_len"], run["n_decode"]
        forced = make_tokens(seed, P + n, model.config.vocab_size)
        results[f"{name}/forced.h5"] = dump_sequence(
            model, rec, tmp, "forced.h5", prompt=forced[:P], forced=forced, n_decode=n, mode="forced",
            store_fn=all_positions, seed=seed, label=f"{name} forced")
        rec.remove()
        ok = True
    finally:
        finish_set(tmp, folder, ok)


# ---- official naming, FP8 / FP4
def official_name(tf):
    """transformers module name -> (official checkpoint name, storage kind). Experts handled by the caller."""
    glob = {"model.embed_tokens.weight": ("embed.weight", "bf16"), "lm_head.weight": ("head.weight", "bf16"),
            "model.norm.weight": ("norm.weight", "bf16"), "model.hc_head.hc_fn": ("hc_head_fn", "f32"),
            "model.hc_head.hc_base": ("hc_head_base", "f32"), "model.hc_head.hc_scale": ("hc_head_scale", "f32")}
    if tf in glob:
        return glob[tf]
    parts = tf.split(".")
    need(parts[:2] == ["model", "layers"], f"official_name: unexpected tensor {tf}")
    L, rest = parts[2], ".".join(parts[3:])
    table = {
        "self_attn.q_a_proj.weight": ("attn.wq_a.weight", "fp8"),
        "self_attn.q_a_norm.weight": ("attn.q_norm.weight", "bf16"),
        "self_attn.q_b_proj.weight": ("attn.wq_b.weight", "fp8"),
        "self_attn.kv_proj.weight": ("attn.wkv.weight", "fp8"),
        "self_attn.kv_norm.weight": ("attn.kv_norm.weight", "bf16"),
        "self_attn.o_a_proj.weight": ("attn.wo_a.weight", "fp8"),
        "self_attn.o_b_proj.weight": ("attn.wo_b.weight", "fp8"),
        "self_attn.sinks": ("attn.attn_sink", "f32"),
        "self_attn.compressor.kv_proj.weight": ("attn.compressor.wkv.weight", "bf16"),
        "self_attn.compressor.gate_proj.weight": ("attn.compressor.wgate.weight", "bf16"),
        "self_attn.compressor.position_bias": ("attn.compressor.ape", "f32"),
        "self_attn.compressor.kv_norm.weight": ("attn.compressor.norm.weight", "bf16"),
        "self_attn.compressor.indexer.q_b_proj.weight": ("attn.indexer.wq_b.weight", "fp8"),
        "self_attn.compressor.indexer.scorer.weights_proj.weight": ("attn.indexer.weights_proj.weight", "bf16"),
        "self_attn.compressor.indexer.kv_proj.weight": ("attn.indexer.compressor.wkv.weight", "bf16"),
        "self_attn.compressor.indexer.gate_proj.weight": ("attn.indexer.compressor.wgate.weight", "bf16"),
        "self_attn.compressor.indexer.position_bias": ("attn.indexer.compressor.ape", "f32"),
        "self_attn.compressor.indexer.kv_norm.weight": ("attn.indexer.compressor.norm.weight", "bf16"),
        "mlp.gate.weight": ("ffn.gate.weight", "bf16"),
        "mlp.gate.tid2eid": ("ffn.gate.tid2eid", "i64"),
        "mlp.gate.e_score_correction_bias": ("ffn.gate.bias", "f32"),
        "mlp.shared_experts.gate_proj.weight": ("ffn.shared_experts.w1.weight", "fp8"),
        "mlp.shared_experts.up_proj.weight": ("ffn.shared_experts.w3.weight", "fp8"),
        "mlp.shared_experts.down_proj.weight": ("ffn.shared_experts.w2.weight", "fp8"),
        "input_layernorm.weight": ("attn_norm.weight", "bf16"),
        "post_attention_layernorm.weight": ("ffn_norm.weight", "bf16"),
        "attn_hc.fn": ("hc_attn_fn", "f32"), "attn_hc.base": ("hc_attn_base", "f32"),
        "attn_hc.scale": ("hc_attn_scale", "f32"),
        "ffn_hc.fn": ("hc_ffn_fn", "f32"), "ffn_hc.base": ("hc_ffn_base", "f32"),
        "ffn_hc.scale": ("hc_ffn_scale", "f32"),
    }
    need(rest in table, f"official_name: no official name for {tf}")
    n, kind = table[rest]
    return f"layers.{L}.{n}", kind


def e8m0_bytes(exp):
    exp = np.asarray(exp, dtype=np.int64)
    need(exp.min() >= -127 and exp.max() <= 127, f"e8m0 exponent out of range [{exp.min()}, {exp.max()}]")
    return (exp + 127).astype(np.uint8)


def pow2(exp):
    return np.ldexp(np.float32(1.0), np.asarray(exp, dtype=np.int32)).astype(np.float32)


def quant_fp8(w):
    """[out, in] f32 -> (e4m3 bytes [out, in], e8m0 bytes [ceil(out/128), ceil(in/128)]): ue8m0 block scale
    2^ceil(log2(amax/448)) per 128x128 block."""
    w = w.detach().float()
    o, i = w.shape
    bo, bi = -(-o // 128), -(-i // 128)
    pad = torch.zeros(bo * 128, bi * 128)
    pad[:o, :i] = w
    amax = pad.view(bo, 128, bi, 128).abs().amax(dim=(1, 3)).double().clamp(min=1e-4).numpy()
    exp = np.ceil(np.log2(amax / 448.0)).astype(np.int64)
    s = torch.from_numpy(pow2(exp)).repeat_interleave(128, 0).repeat_interleave(128, 1)[:o, :i]
    q = (w / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).numpy().copy(), e8m0_bytes(exp)


def dequant_fp8(qb, sb):
    o, i = qb.shape
    q = torch.from_numpy(qb.copy()).view(torch.float8_e4m3fn).float()
    s = torch.from_numpy(pow2(sb.astype(np.int64) - 127)).repeat_interleave(128, 0).repeat_interleave(128, 1)
    return q * s[:o, :i]


FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # e2m1 codes 0..7; codes 8..15 are their negatives


def quant_fp4(w):
    """[out, in] f32 -> (packed int8 [out, in/2], low nibble = even column; e8m0 bytes [out, in/32]):
    scale 2^ceil(log2(amax/6)) per 32 input columns, nearest e2m1 code."""
    w = w.detach().float()
    o, i = w.shape
    need(i % 32 == 0, f"FP4 expert weight with {i} input columns (not a multiple of 32)")
    g = w.view(o, i // 32, 32)
    amax = g.abs().amax(-1).double().clamp(min=6 * 2.0 ** -126).numpy()
    exp = np.ceil(np.log2(amax / 6.0)).astype(np.int64)
    x = g / torch.from_numpy(pow2(exp)).unsqueeze(-1)
    need(float(x.abs().max()) <= 6.0, "FP4 scaling left a value above 6")
    idx = (x.abs().unsqueeze(-1) - torch.tensor(FP4_VALUES)).abs().argmin(-1)
    code = (idx | (((x < 0) & (idx > 0)).long() << 3)).view(o, i)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return packed.view(torch.int8).numpy().copy(), e8m0_bytes(exp)


def dequant_fp4(pb, sb):
    b = torch.from_numpy(pb.copy()).view(torch.uint8).long()
    o, half = b.shape
    lut = torch.tensor(FP4_VALUES + [-v for v in FP4_VALUES])
    vals = torch.empty(o, half * 2)
    vals[:, 0::2] = lut[b & 15]
    vals[:, 1::2] = lut[b >> 4]
    s = torch.from_numpy(pow2(sb.astype(np.int64) - 127)).repeat_interleave(32, 1)
    return vals * s


ST_DTYPE = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F8_E4M3": np.dtype("u1"), "F8_E8M0": np.dtype("u1"),
            "I8": np.dtype("i1"), "I64": np.dtype("<i8")}


def write_safetensors(path, tensors):
    """tensors: name -> (dtype name, numpy array with the raw element bytes). Laid out as the safetensors
    library does: header padded with spaces to 8 bytes, tensors by element size (largest first) then name, so
    every tensor is aligned to its element size; metadata {format: pt}."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors, key=lambda n: (-ST_DTYPE[tensors[n][0]].itemsize, n)):
        dt, arr = tensors[name]
        arr = np.ascontiguousarray(arr)
        need(arr.dtype == ST_DTYPE[dt], f"{name}: {arr.dtype} for {dt}")
        raw = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        arr = np.frombuffer(data[base + b:base + e], dtype=ST_DTYPE[v["dtype"]]).reshape(v["shape"])
        out[name] = (v["dtype"], arr.copy())
    return out


def bf16_bits(t):
    return t.detach().float().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()


def from_bf16_bits(u):
    return torch.from_numpy((u.astype(np.uint32) << 16).view(np.float32).copy())


def to_official(model):
    """The model's state dict in official checkpoint naming and dtypes (model-spec §2)."""
    cfg = model.config
    I = cfg.moe_intermediate_size
    out = {}
    for tf, t in sorted(model.state_dict().items()):
        if tf.endswith("mlp.experts.gate_up_proj") or tf.endswith("mlp.experts.down_proj"):
            L = tf.split(".")[2]
            for e in range(t.shape[0]):
                pre = f"layers.{L}.ffn.experts.{e}"
                if tf.endswith("gate_up_proj"):
                    mats = {"w1": t[e, :I], "w3": t[e, I:]}
                else:
                    mats = {"w2": t[e]}
                for w, m in mats.items():
                    q, s = quant_fp4(m)
                    out[f"{pre}.{w}.weight"] = ("I8", q)
                    out[f"{pre}.{w}.scale"] = ("F8_E8M0", s)
            continue
        name, kind = official_name(tf)
        if kind == "fp8":
            q, s = quant_fp8(t)
            out[name] = ("F8_E4M3", q)
            out[name[:-len(".weight")] + ".scale"] = ("F8_E8M0", s)
        elif kind == "bf16":
            out[name] = ("BF16", bf16_bits(t))
        elif kind == "f32":
            out[name] = ("F32", t.detach().float().numpy().copy())
        else:
            need(t.dtype == torch.int64, f"{tf}: {t.dtype}")
            out[name] = ("I64", t.numpy().astype(np.int64))
    return out


def from_official(model, tensors):
    """Dequantise an official-format tensor dict back into the model's transformers state dict."""
    cfg = model.config
    sd = {}
    used = set()

    def get(name):
        need(name in tensors, f"official file lacks {name}")
        used.add(name)
        return tensors[name]

    for tf, t in model.state_dict().items():
        if tf.endswith("mlp.experts.gate_up_proj") or tf.endswith("mlp.experts.down_proj"):
            L = tf.split(".")[2]
            mats = []
            for e in range(t.shape[0]):
                pre = f"layers.{L}.ffn.experts.{e}"
                ws = ["w1", "w3"] if tf.endswith("gate_up_proj") else ["w2"]
                parts = []
                for w in ws:
                    (dq, q), (ds_, s) = get(f"{pre}.{w}.weight"), get(f"{pre}.{w}.scale")
                    need(dq == "I8" and ds_ == "F8_E8M0", f"{pre}.{w}: dtypes {dq}/{ds_}")
                    parts.append(dequant_fp4(q, s))
                mats.append(torch.cat(parts, 0))
            sd[tf] = torch.stack(mats)
            continue
        name, kind = official_name(tf)
        dt, arr = get(name)
        if kind == "fp8":
            dsn, s = get(name[:-len(".weight")] + ".scale")
            need(dt == "F8_E4M3" and dsn == "F8_E8M0", f"{name}: dtypes {dt}/{dsn}")
            sd[tf] = dequant_fp8(arr, s)
        elif kind == "bf16":
            need(dt == "BF16", f"{name}: {dt}")
            sd[tf] = from_bf16_bits(arr)
        elif kind == "f32":
            need(dt == "F32", f"{name}: {dt}")
            sd[tf] = torch.from_numpy(arr.copy())
        else:
            need(dt == "I64", f"{name}: {dt}")
            sd[tf] = torch.from_numpy(arr.copy())
        need(tuple(sd[tf].shape) == tuple(t.shape), f"{name}: shape {tuple(sd[tf].shape)} vs {tuple(t.shape)}")
    extra = sorted(set(tensors) - used)
    need(not extra, f"official file has tensors nothing uses: {extra[:6]}")
    return sd


def gen_tiny_fp8(out, results, tiny_model, forced):
    s = TINY
    folder = os.path.join(out, "tiny-fp8")
    tmp = folder + ".tmp"
    fresh_dir(tmp)
    ok = False
    try:
        cfg_dict = json.loads(tiny_model.config.to_json_string(use_diff=False))
        cfg_dict["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                           "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
        cfg_dict["expert_dtype"] = "fp4"
        with open(os.path.join(tmp, "config.json"), "w") as f:
            f.write(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n")
        tensors = to_official(tiny_model)
        path = os.path.join(tmp, "model.safetensors")
        write_safetensors(path, tensors)
        kinds = Counter(dt for dt, _ in tensors.values())
        log(f"  tiny-fp8 model.safetensors: {len(tensors)} tensors, dtypes {dict(kinds)}")
        try:
            from safetensors import safe_open
            with safe_open(path, framework="pt") as st:
                k = next(n for n in st.keys() if n.endswith("wq_a.scale"))
                log(f"  safetensors.safe_open reads it: {k} {st.get_tensor(k).dtype}")
        except Exception as e:  # informative only: the C loader is what must read it
            log(f"  note: safetensors.safe_open could not read the file: {type(e).__name__}: {e}")
        sd = from_official(tiny_model, read_safetensors(path))
        model = copy.deepcopy(tiny_model)
        model.load_state_dict(sd, strict=True)
        model.eval()
        ref = tiny_model.state_dict()
        errs = defaultdict(float)
        for tf, t in sd.items():
            if t.is_floating_point():
                kind = "fp4" if ".experts." in tf else official_name(tf)[1]
                errs[kind] = max(errs[kind], float((t - ref[tf]).abs().max() / ref[tf].abs().max()))
        log(f"  dequantised vs tiny weights, max|diff|/max|w| per kind: "
            + ", ".join(f"{k} {v:.3g}" for k, v in sorted(errs.items())))
        need(errs["f32"] == 0.0 and errs["fp8"] < 0.07 and errs["fp4"] < 0.34 and errs["bf16"] < 0.01,
             f"quantisation error out of range: {dict(errs)}")
        rec = Capture(model, log=log)
        P, n = s["prompt_len"], s["n_decode"]
        results["tiny-fp8/forced.h5"] = dump_sequence(
            model, rec, tmp, "forced.h5", prompt=forced[:P], forced=forced, n_decode=n, mode="forced",
            store_fn=all_positions, seed=s["seed"], label="tiny-fp8 forced")
        ok = True
    finally:
        finish_set(tmp, folder, ok)


# ------------------------------------------------------------------------------------------------ compare
def compare_sets(a, b):
    """Every file of either folder in the other: .h5 files dataset by dataset (dtype, shape and bytes, so -0.0
    against 0.0 or two NaN payloads count as differences) and attribute by attribute (all but `command`), every
    other file byte for byte. Returns 0 when identical, 1 when not, 2 when a folder cannot be read or holds no
    dump to compare."""
    import h5py
    lists = {}
    for d in (a, b):
        try:
            lists[d] = sorted(os.listdir(d))
        except OSError as e:
            log(f"REPRODUCIBILITY: {d}: cannot list the folder: {e.strerror}")
            return 2
    bad = []
    nds = nh5 = 0
    for fn in sorted(set(lists[a]) | set(lists[b])):
        pa, pb = os.path.join(a, fn), os.path.join(b, fn)
        if fn not in lists[b] or fn not in lists[a]:
            bad.append(f"{fn}: missing in {b if fn not in lists[b] else a}")
            continue
        if not fn.endswith(".h5"):
            if os.path.isfile(pa) and os.path.isfile(pb) and sha256_file(pa) != sha256_file(pb):
                bad.append(f"{fn}: bytes differ")
            continue
        nh5 += 1
        with h5py.File(pa, "r") as fa, h5py.File(pb, "r") as fb:
            for k in sorted(set(fa.attrs) | set(fb.attrs)):
                if k == "command":
                    continue
                if k not in fa.attrs or k not in fb.attrs or fa.attrs[k] != fb.attrs[k]:
                    bad.append(f"{fn}: attribute {k} differs")
            names_a, names_b = [], []
            fa.visititems(lambda n, o: names_a.append(n) if isinstance(o, h5py.Dataset) else None)
            fb.visititems(lambda n, o: names_b.append(n) if isinstance(o, h5py.Dataset) else None)
            if sorted(names_a) != sorted(names_b):
                bad.append(f"{fn}: dataset lists differ: only in {a}: {sorted(set(names_a) - set(names_b))[:4]}, "
                           f"only in {b}: {sorted(set(names_b) - set(names_a))[:4]}")
            for n in names_a:
                if n not in fb:
                    continue
                nds += 1
                x, y = fa[n][()], fb[n][()]
                if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                    bad.append(f"{fn}:{n} differs")
    if bad:
        log(f"REPRODUCIBILITY: {a} vs {b}: {len(bad)} differences: " + "; ".join(bad[:20]))
        return 1
    if nh5 == 0:
        log(f"REPRODUCIBILITY: {a} vs {b}: no .h5 dump in either folder: nothing compared")
        return 2
    log(f"REPRODUCIBILITY: {a} vs {b}: bit-identical ({nh5} dumps, {nds} datasets, all attributes but `command`, "
        f"every other file's bytes)")
    return 0


# ------------------------------------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="all", choices=["all", "tiny", "topk512", "tiny-fp8"])
    ap.add_argument("--out", default="golden")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two set folders bit for bit")
    ap.add_argument("--random-arch", metavar="SEEDS",
                    help="instead of --set: drawn architectures random-S for seeds S (e.g. 101-110 or 1,4,9)")
    ap.add_argument("--describe", action="store_true", help="with --random-arch: print what each seed draws, "
                    "make nothing (needs no torch)")
    args = ap.parse_args()
    if args.compare:
        return compare_sets(*args.compare)
    seeds = []
    if args.random_arch is not None:
        try:
            seeds = parse_seeds(args.random_arch)
        except GoldenError as e:
            log(f"make_golden.py: {e}")
            return 2
        if args.describe:
            for seed in seeds:
                log(f"random-{seed}: {describe_arch(*random_arch(seed))}")
            return 0
    import_torch()
    tv, pv = versions()
    log(f"versions: python {sys.version.split()[0]}, torch {torch.__version__}, transformers {tv}, "
        f"numpy {np.__version__}; threads {torch.get_num_threads()}")
    os.makedirs(args.out, exist_ok=True)
    results, failed = {}, []
    t0 = time.time()
    tiny_model = forced = None
    if seeds:
        args.set = "none"
    for seed in seeds:
        log(f"== random-{seed}")
        try:
            gen_random(args.out, results, seed)
        except Exception:
            traceback.print_exc()
            failed.append(f"random-{seed}")
    if args.set in ("all", "tiny", "tiny-fp8"):
        log("== tiny")
        try:
            if args.set == "tiny-fp8":
                tiny_model = build_model(tiny_config(), TINY["seed"])
                forced = make_tokens(TINY["seed"], TINY["prompt_len"] + TINY["n_decode"],
                                     tiny_model.config.vocab_size)
            else:
                tiny_model, forced = gen_tiny(args.out, results)
        except Exception:
            traceback.print_exc()
            failed.append("tiny")
    if args.set in ("all", "tiny-fp8") and tiny_model is None:
        # tiny-fp8 is made from the tiny model: not made is a failure too, not a set left out of the summary
        log("== tiny-fp8: not run (it is made from the tiny model, which failed)")
        failed.append("tiny-fp8 (not run)")
    elif args.set in ("all", "tiny-fp8"):
        log("== tiny-fp8")
        try:
            gen_tiny_fp8(args.out, results, tiny_model, forced)
        except Exception:
            traceback.print_exc()
            failed.append("tiny-fp8")
    if args.set in ("all", "topk512"):
        log("== topk512")
        try:
            gen_topk512(args.out, results)
        except Exception:
            traceback.print_exc()
            failed.append("topk512")
    log("== summary")
    for k, v in results.items():
        log(f"  {k}: cached vs no-cache relative logit difference {v:.3g}")
    log(f"  time {time.time() - t0:.1f}s; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
