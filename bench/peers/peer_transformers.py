#!/usr/bin/env python3
"""peer_transformers.py - the peer of `dsv4 bench`: transformers' own DeepseekV4ForCausalLM in bf16 on the same GPU,
eager (no torch.compile, attn_implementation="eager", the experts backend transformers picks by default), with the
same shapes, layer schedule, batch C and live context as the dsv4 bench run, and the same token counts (warm-up and
timed decode steps).

How it runs (per live context): one REAL prefill of ctx - 128 tokens through transformers (so the caches are
transformers' own), the cache is then copied along the batch to C sequences (every batch-leading tensor of the
cache layers repeated C times: C identical sequences; transformers' work per step does not depend on the values),
then `warmup` untimed and `reps` timed one-token decode steps over the C sequences. Each step is timed with
torch.cuda.Event around the model call; the median and min..max are reported. The weights are random (transformers'
init, with the degenerate hash table tid2eid and routing bias replaced by random valid values so routing spreads
over the experts as in dsv4 bench).

Usage (on the GPU machine, where torch and transformers >= 5.8 are installed):
  python3 bench/peers/peer_transformers.py --layers 5 --batch 1,64 --context 4096 --json OUT.json
  python3 bench/peers/peer_transformers.py --like bench.json --batch 1,64 --context 4096 --json OUT.json
  python3 bench/peers/peer_transformers.py --layers 4 --prefill-only 8192 --warmup 1 --reps 3 --json OUT.json
    (the prefill peer of `dsv4 bench --prefill 8192`: one prompt from an empty cache, CUDA-event timed)
    (--like takes layers, warm-up, reps and the maximum context from a dsv4 bench JSON, over --layers, --warmup,
    --reps and --max-context)
The JSON is rewritten after every measured run, under a temporary name renamed when complete, so a run cut short
by a timeout leaves a whole file. Bad arguments (a --like file that is missing or not a bench JSON, a --batch or
--context that is not a list of positive integers, a context of 128 or less) are usage errors (exit 2), found
before torch is imported.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"


def write_json_atomic(path, obj):
    """json.dump to path under a temporary name, renamed when complete (the bench's timeout may kill a save)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def int_list(text, what, least):
    """'1,64' -> [1, 64]; every value >= least, else a usage error naming the option."""
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} {text!r}: not a comma-separated list of integers") from None
    bad = [v for v in vals if v < least]
    if bad:
        raise argparse.ArgumentTypeError(f"{what} {text!r}: {bad[0]} is below {least}")
    return vals


def log(msg):
    print(f"[peer {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def make_config(DeepseekV4Config, layers, max_pos):
    """Flash values (model-spec §1.1) with the Flash schedule from layer 2 on: CSA (hash MoE), HCA, CSA, ..."""
    kw = dict(vocab_size=129280, hidden_size=4096, num_hidden_layers=layers, num_attention_heads=64,
              num_key_value_heads=1, head_dim=512, partial_rotary_factor=64 / 512, q_lora_rank=1024, o_groups=8,
              o_lora_rank=1024, sliding_window=128, index_n_heads=64, index_head_dim=128, index_topk=512,
              n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=6, moe_intermediate_size=2048,
              routed_scaling_factor=1.5, swiglu_limit=10.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
              rms_norm_eps=1e-6, max_position_embeddings=max_pos, rope_theta=10000.0, compress_rope_theta=160000.0,
              layer_types=[CSA if L % 2 == 0 else HCA for L in range(layers)],
              mlp_layer_types=["hash_moe" if L == 0 else "moe" for L in range(layers)],
              compress_rates={CSA: 4, HCA: 128}, tie_word_embeddings=False)
    rs = dict(type="yarn", factor=16, original_max_position_embeddings=65536, beta_fast=32, beta_slow=1)
    try:
        cfg = DeepseekV4Config(**kw, rope_scaling=rs)
        if cfg.rope_parameters.get("compress", {}).get("rope_type") == "yarn":
            return cfg
    except (TypeError, ValueError) as e:
        log(f"note: rope_scaling not accepted ({e}); passing rope_parameters")
    prf = kw["partial_rotary_factor"]
    kw["rope_parameters"] = {
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": prf},
        "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16,
                     "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                     "partial_rotary_factor": prf, "attention_factor": 1.0}}
    return DeepseekV4Config(**kw)


def randomise_routing(torch, model, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for name, buf in model.named_buffers():
        if name.endswith("tid2eid"):
            V, k = buf.shape
            E = model.config.n_routed_experts
            base = torch.randint(0, E, (V, 1), generator=g, device="cuda")
            buf.copy_(((base + 37 * torch.arange(k, device="cuda")) % E).to(buf.dtype))
    for name, p in model.named_parameters():
        if "e_score_correction_bias" in name or name.endswith("gate.bias"):
            with torch.no_grad():
                p.normal_(0.0, 0.05, generator=g)


def expand_cache(torch, cache, C):
    """Repeat every batch-leading tensor of the cache layers C times (dicts, lists and tuples walked)."""
    def ex(v):
        if torch.is_tensor(v):
            return v.repeat(C, *([1] * (v.dim() - 1))) if v.dim() >= 1 and v.shape[0] == 1 else v
        if isinstance(v, dict):
            return {k: ex(x) for k, x in v.items()}
        if isinstance(v, list):
            return [ex(x) for x in v]
        if isinstance(v, tuple):
            return tuple(ex(x) for x in v)
        return v
    for layer in getattr(cache, "layers", []):
        for k, v in list(vars(layer).items()):
            setattr(layer, k, ex(v))
    return cache


def prefill_only(torch, DynamicCache, model, cfg, gen, a, out, save):
    """The prefill peer of `dsv4 bench --prefill N`: one N-token random prompt through the model from an empty cache,
    --warmup untimed then --reps timed (CUDA events around the call; the median reported), batch 1."""
    n = a.prefill_only
    out["state"] = f"prefill of one {n}-token random prompt from an empty cache, batch 1"
    times = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        for s in range(a.warmup + a.reps):
            prompt = torch.randint(2, cfg.vocab_size, (1, n), generator=gen, device="cuda")
            try:
                cache = DynamicCache(config=model.config)
            except TypeError:
                cache = None
            with torch.no_grad():
                e0.record()
                try:
                    o = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
                except TypeError:
                    o = model(input_ids=prompt, past_key_values=cache, use_cache=True)
                e1.record()
                torch.cuda.synchronize()
            if not torch.isfinite(o.logits).all():
                raise RuntimeError("non-finite logits")
            del o, cache
            ms = e0.elapsed_time(e1)
            log(f"prefill {n}: rep {s}: {ms:.1f} ms{' (warm-up)' if s < a.warmup else ''}")
            if s >= a.warmup:
                times.append(ms)
            torch.cuda.empty_cache()
        med = statistics.median(times)
        out["prefill"] = {"tokens": n, "ms": times, "ms_median": med, "tokens_per_s": 1e3 * n / med}
        log(f"prefill {n}: {med:.1f} ms median of {len(times)}, {1e3 * n / med:.0f} tokens/s")
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        out["failures"].append({"prefill": n, "error": repr(e)[:500]})
        log(f"prefill {n}: FAILED: {e!r}")
        save()
        return 1
    out["complete"] = True
    save()
    return 0


def main():
    global T0
    T0 = time.time()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--like", help="a dsv4 bench JSON: take layers, warmup, reps and max context from it")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--context", default="4096")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-context", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--deadline", type=float, default=0, help="seconds; skip what would start after it")
    ap.add_argument("--prefill-only", type=int, default=0, metavar="N",
                    help="time the prefill of one N-token prompt instead (--warmup untimed, --reps timed; no decode)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.like:
        try:
            with open(a.like) as f:
                b = json.load(f)
            a.layers = int(b["model"]["layers"])
            a.warmup, a.reps = int(b["method"]["warmup"]), int(b["method"]["reps"])
            a.max_context = int(b["method"]["max_context"])
        except OSError as e:
            ap.error(f"--like {a.like}: cannot read: {e.strerror}")
        except json.JSONDecodeError as e:
            ap.error(f"--like {a.like}: not valid JSON ({e})")
        except (KeyError, TypeError, ValueError) as e:
            ap.error(f"--like {a.like}: not a dsv4 bench JSON (model.layers, method.warmup/reps/max_context: "
                     f"{type(e).__name__} {e})")
    try:
        batches = int_list(a.batch, "--batch", 1)
        contexts = int_list(a.context, "--context", 129)  # the prefill is ctx - 128 tokens
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if a.layers < 1 or a.warmup < 0 or a.reps < 1:
        ap.error(f"--layers {a.layers}, --warmup {a.warmup}, --reps {a.reps}: need layers >= 1, warmup >= 0, "
                 f"reps >= 1")
    if max(contexts) > a.max_context:
        ap.error(f"--context {max(contexts)} is past the maximum context {a.max_context}")
    if a.prefill_only < 0 or a.prefill_only > a.max_context:
        ap.error(f"--prefill-only {a.prefill_only}: want 1 .. the maximum context {a.max_context}")

    import torch
    import transformers
    from transformers import DynamicCache
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4ForCausalLM

    out = {"schema": "dsv4-bench-peer/1", "peer": "transformers DeepseekV4ForCausalLM, bf16, eager",
           "transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "layers": a.layers, "warmup": a.warmup, "reps": a.reps,
           "state": "real transformers prefill of ctx-128 tokens (one sequence), cache repeated along the batch",
           "runs": [], "failures": []}

    def save():
        out["elapsed_s"] = time.time() - T0
        write_json_atomic(a.json, out)

    torch.manual_seed(a.seed)
    cfg = make_config(DeepseekV4Config, a.layers, a.max_context)
    try:
        cfg._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001 - then the model's default, recorded below
        log(f"note: cannot set attn_implementation on the config ({e!r})")
    log(f"building {a.layers} layers {cfg.layer_types} in bf16 on the GPU")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = DeepseekV4ForCausalLM(cfg)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("eager")
        except Exception as e:  # noqa: BLE001
            log(f"note: set_attn_implementation('eager') failed ({e!r})")
    randomise_routing(torch, model, a.seed)
    out["attn_implementation"] = str(getattr(model.config, "_attn_implementation", None))
    out["experts_implementation"] = str(getattr(model.config, "_experts_implementation", None))
    out["weights_gib"] = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    log(f"built: {out['weights_gib']:.1f} GiB of parameters, attn {out['attn_implementation']}, "
        f"experts {out['experts_implementation']}")
    save()
    gen = torch.Generator(device="cuda").manual_seed(a.seed + 1)
    if a.prefill_only:
        return prefill_only(torch, DynamicCache, model, cfg, gen, a, out, save)
    for ctx in contexts:
        pos0 = ctx - 128
        if a.deadline and time.time() - T0 > a.deadline:
            out["failures"].append({"context": ctx, "error": "skipped: deadline"})
            break
        try:
            prompt = torch.randint(2, cfg.vocab_size, (1, pos0), generator=gen, device="cuda")
            try:
                cache0 = DynamicCache(config=model.config)
            except TypeError:
                cache0 = None
            torch.cuda.synchronize()
            t0 = time.time()
            with torch.no_grad():
                try:
                    o = model(input_ids=prompt, past_key_values=cache0, use_cache=True, logits_to_keep=1)
                except TypeError:
                    o = model(input_ids=prompt, past_key_values=cache0, use_cache=True)
            torch.cuda.synchronize()
            cache0 = o.past_key_values if cache0 is None else cache0
            del o
            prefill_s = time.time() - t0
            log(f"ctx {ctx}: prefill of {pos0} tokens in {prefill_s:.2f} s "
                f"(cache layers {[type(l).__name__ for l in getattr(cache0, 'layers', [])]})")
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            out["failures"].append({"context": ctx, "stage": "prefill", "error": repr(e)[:500]})
            log(f"ctx {ctx}: prefill FAILED: {e!r}")
            save()
            continue
        for C in batches:
            if a.deadline and time.time() - T0 > a.deadline:
                out["failures"].append({"C": C, "context": ctx, "error": "skipped: deadline"})
                continue
            try:
                cache = expand_cache(torch, copy.deepcopy(cache0), C) if C > 1 else copy.deepcopy(cache0)
                times = []
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.no_grad():
                    for s in range(a.warmup + a.reps):
                        tok = torch.randint(2, cfg.vocab_size, (C, 1), generator=gen, device="cuda")
                        e0.record()
                        o = model(input_ids=tok, past_key_values=cache, use_cache=True)
                        e1.record()
                        torch.cuda.synchronize()
                        if s >= a.warmup:
                            times.append(e0.elapsed_time(e1))
                        if not torch.isfinite(o.logits).all():
                            raise RuntimeError("non-finite logits")
                        del o
                med = statistics.median(times)
                r = {"C": C, "context": ctx, "pos0": pos0, "ms_median": med, "ms_min": min(times),
                     "ms_max": max(times), "tokens_per_s": 1e3 * C / med, "prefill_s": prefill_s}
                out["runs"].append(r)
                log(f"  C={C} ctx {ctx}: {med:.2f} ms/step ({min(times):.2f}..{max(times):.2f}), "
                    f"{r['tokens_per_s']:.1f} tokens/s")
                del cache
            except Exception as e:  # noqa: BLE001
                out["failures"].append({"C": C, "context": ctx, "stage": "decode", "error": repr(e)[:500]})
                log(f"  C={C} ctx {ctx}: FAILED: {e!r}")
            torch.cuda.empty_cache()
            save()
        del cache0
        torch.cuda.empty_cache()
    out["complete"] = True
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
