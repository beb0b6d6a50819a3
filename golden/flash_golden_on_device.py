#!/usr/bin/env python3
"""flash_golden_on_device.py - a Flash-shaped golden on demand: a random DeepSeek-V4 model with the REAL Flash widths and
head shapes but few layers and experts, saved in the official FP8/FP4 checkpoint format (so that a serving engine,
whose kernels assert the real head shapes, can load it), with its transformers golden dump. Not committed (the
weights are about 3.6 GB); regenerated bit for bit by running this again with the same arguments and --threads on the
same software (golden/make_golden.py --compare checks two runs).

Widths (model-spec §1, the released config): hidden 4096, 64 heads x 512 (rope 64), q_lora 1024, o_groups 8 x o_lora
1024, sliding window 128, CSA ratio 4 with a 64 x 128 indexer and index_topk 512, HCA ratio 128, hc_mult 4 with 20
Sinkhorn iterations, experts of 2048 with top-6 routing, routed scale 1.5, SwiGLU limit 10, vocab 129280, YaRN
compress rope (factor 16, original 65536). Shrunk: --layers (default 4: sliding, CSA, HCA, CSA; hash routing on the
first two) and --experts (default 16 routed + 1 shared: divisible by tensor/expert parallel sizes up to 8).

The golden: transformers' DeepseekV4ForCausalLM in fp32 on the CPU, on the weights dequantised back from the official
file (as golden/tiny-fp8), prefill of --prompt tokens (default 2100: the CSA layers then see 525 > 512 entries at the
last prompt position, so the real top-512 ranking is exercised) and --decode forced steps, the rows of a few prompt
positions (0, 127, 128: the window edge; 2047, 2050, 2051: the last position whose selection is every entry and the
first that ranks) and every decode position stored, through the kit's transformers adapter and DumpWriter; the same
checks as make_golden.py (cached decode against transformers' own no-cache forward, pools against the cache, router,
mHC and top-k rows).

Cost (estimate, to be replaced by the device's measurement): ~3.3 B parameters (13 GB in fp32; ~40 GB peak while
quantising); one forward over 2100 tokens is ~9 TFLOP, and the run makes two (the cached prefill + decode and the
no-cache check; --skip-nocache leaves the second out); with --threads 16 a few minutes in all.

Usage (on the device machine; torch, transformers >= 5.8, h5py, numpy):
  python3 golden/flash_golden_on_device.py --out /tmp/dsv4-flash [--layers 4] [--experts 16] [--prompt 2100]
        [--decode 8] [--seed 4096] [--threads 16] [--skip-nocache]
writes OUT/flash/{config.json, model.safetensors, forced.h5, arch.json}. golden/flash_golden_on_device.sh runs it and
then verifies dsv4's ref-gpu against it.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402  (the golden generator: model building, quantisation, checks, writing)
from make_golden import CSA, HCA, SLIDING, need, log  # noqa: E402


def flash_config(n_layers, n_experts):
    """The released DeepSeek-V4-Flash config's widths with n_layers (sliding, then CSA/HCA alternating) and
    n_experts routed experts (top-6)."""
    need(n_layers >= 3, "--layers: at least 3 (one sliding, one CSA, one HCA layer)")
    need(n_experts >= 6, "--experts: at least 6 (top-6 routing)")
    types = [SLIDING] + [CSA if i % 2 else HCA for i in range(1, n_layers)]
    n_hash = min(2, n_layers - 1)
    return dict(
        vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=n_layers,
        num_attention_heads=64, num_key_value_heads=1, head_dim=512, q_lora_rank=1024, partial_rotary_factor=64 / 512,
        num_experts_per_tok=6, n_routed_experts=n_experts, n_shared_experts=1, layer_types=types,
        mlp_layer_types=["hash_moe"] * n_hash + ["moe"] * (n_layers - n_hash),
        compress_rates={CSA: 4, HCA: 128}, sliding_window=128, o_groups=8, o_lora_rank=1024, index_n_heads=64,
        index_head_dim=128, index_topk=512, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
        max_position_embeddings=1048576, rope_theta=10000.0, compress_rope_theta=160000.0, swiglu_limit=10.0,
        routed_scaling_factor=1.5, scoring_func="sqrtsoftplus", norm_topk_prob=True, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=1,
        rope_scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                      "beta_slow": 1.0},
    )


def engine_config(model, kw):
    """config.json as the official checkpoint ships it, so that engines that read the legacy keys (vLLM and SGLang
    read compress_ratios and num_hash_layers) and dsv4 and transformers (layer_types, mlp_layer_types) all see one
    model: transformers' complete config plus the released checkpoint's keys."""
    cfg = json.loads(model.config.to_json_string(use_diff=False))
    ratio = {SLIDING: 0, CSA: 4, HCA: 128}
    cfg.update({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "compress_ratios": [ratio[t] for t in kw["layer_types"]] + [0],  # + the MTP block's entry, as released
        "num_hash_layers": kw["mlp_layer_types"].count("hash_moe"), "num_nextn_predict_layers": 0,
        "qk_rope_head_dim": 64, "topk_method": "noaux_tc", "hidden_act": "silu", "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
        "expert_dtype": "fp4",
    })
    return cfg


def stored_positions(P, n_decode):
    """A few prompt positions and every decode position: the window edge, the CSA selection's last all-entries
    position and first ranked one, the last prompt position."""
    marks = [0, 127, 128, 2047, 2050, 2051, P - 1]
    return sorted({p for p in marks if 0 <= p < P} | set(range(P, P + n_decode)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=2100)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--seed", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--skip-nocache", action="store_true",
                    help="leave out the no-cache forward that checks the cached run (about 40%% of the time)")
    args = ap.parse_args()
    t_start = time.time()
    times = {}

    def lap(name, t0):
        times[name] = time.time() - t0
        log(f"== {name}: {times[name]:.1f} s")
        return time.time()

    mg.import_torch()
    torch = mg.torch
    torch.set_num_threads(args.threads)  # import_torch sets 1; the same count again reproduces the numbers
    tv, pv = mg.versions()
    log(f"versions: python {sys.version.split()[0]}, torch {torch.__version__}, transformers {tv}; threads "
        f"{torch.get_num_threads()}")
    kw = flash_config(args.layers, args.experts)
    folder = os.path.join(args.out, "flash")
    tmp = folder + ".tmp"
    mg.fresh_dir(tmp)
    ok = False
    try:
        t = time.time()
        model = mg.build_model(kw, args.seed)
        n_params = sum(p.numel() for p in model.parameters())
        run = dict(prompt_len=args.prompt, n_decode=args.decode, on_boundary=args.prompt % 4 == 0)
        log(f"  model: {n_params / 1e9:.2f} B parameters, {mg.describe_arch(kw, run)}")
        t = lap("build and randomise", t)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            f.write(json.dumps(engine_config(model, kw), indent=2, sort_keys=True) + "\n")
        try:  # informative: a transformers user loads this file too
            parsed = mg.DeepseekV4Config.from_json_file(os.path.join(tmp, "config.json"))
            need(list(parsed.layer_types) == kw["layer_types"], f"layer_types {parsed.layer_types}")
            log("  config.json: transformers reads it back with the same layer types")
        except Exception as e:
            log(f"  note: transformers does not read the engine-style config.json back: {type(e).__name__}: {e}")
        tensors = mg.to_official(model)
        path = os.path.join(tmp, "model.safetensors")
        mg.write_safetensors(path, tensors)
        kinds = {}
        for dt, _ in tensors.values():
            kinds[dt] = kinds.get(dt, 0) + 1
        del tensors
        log(f"  model.safetensors: {os.path.getsize(path) / 1e9:.2f} GB, tensors by dtype {kinds}")
        t = lap("quantise and write (official FP8/FP4)", t)
        sd = mg.from_official(model, mg.read_safetensors(path))
        ref = model.state_dict()
        errs = {}
        for tf, w in sd.items():
            if w.is_floating_point():
                kind = "fp4" if ".experts." in tf else mg.official_name(tf)[1]
                e = float((w - ref[tf]).abs().max() / ref[tf].abs().max())
                errs[kind] = max(errs.get(kind, 0.0), e)
        log("  dequantised vs random weights, max|diff|/max|w| per kind: "
            + ", ".join(f"{k} {v:.3g}" for k, v in sorted(errs.items())))
        need(errs["f32"] == 0.0 and errs["fp8"] < 0.07 and errs["fp4"] < 0.34 and errs["bf16"] < 0.01,
             f"quantisation error out of range: {errs}")
        model.load_state_dict(sd, strict=True)
        del sd, ref
        model.eval()
        t = lap("dequantise into the model", t)
        with open(os.path.join(tmp, "arch.json"), "w") as f:
            f.write(json.dumps({"flash_golden": {k: v for k, v in vars(args).items() if k != "out"},
                                "config": {k: v for k, v in kw.items() if k != "rope_scaling"},
                                "parameters": n_params}, indent=2, sort_keys=True) + "\n")
        P, n = args.prompt, args.decode
        forced = mg.make_tokens(args.seed, P + n, kw["vocab_size"])
        positions = stored_positions(P, n)
        rec = mg.Capture(model, log=log)
        tokens, logits, cache = mg.run_sequence(model, rec, forced[:P], forced, n, "forced", positions)
        t = lap(f"prefill {P} + {n} decode steps (transformers fp32, {args.threads} threads)", t)
        mg.check_final_state(rec, cache, model.config, len(tokens), "flash forced")
        del cache
        rel = float("nan")
        if not args.skip_nocache:
            rel = mg.nocache_check(model, rec, tokens, logits, positions, "flash forced")
            t = lap("no-cache forward check", t)
        need(bool(torch.isfinite(logits).all()), "flash: non-finite logits")
        mg.probe_summary(rec, model.config, positions)
        mg.validate_rows(model, rec, tokens, positions, "flash forced")
        vis = [(p + 1) // 4 for p in positions]
        log(f"  CSA entries visible at the stored positions: {min(vis)}..{max(vis)} (index_topk 512)")
        with open(os.path.join(tmp, "config.json")) as f:
            config_json = f.read()
        digest = mg.sha256_file(path)
        mg.write_dump(os.path.join(tmp, "forced.h5"), cfg=model.config, config_json=config_json, digest=digest,
                      tokens=tokens, prompt_len=P, n_decode=n, mode="forced", positions=positions, rec=rec,
                      seed=args.seed, label="flash forced", rel=rel)
        rec.remove()
        t = lap("checks and dump", t)
        ok = True
    finally:
        mg.finish_set(tmp, folder, ok)
    log(f"== flash golden: {folder} in {time.time() - t_start:.0f} s ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
