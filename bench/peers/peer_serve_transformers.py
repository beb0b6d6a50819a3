#!/usr/bin/env python3
"""peer_serve_transformers.py - the peer of `dsv4 bench --serve`: transformers' own DeepseekV4ForCausalLM in bf16 on
the same GPU, eager, serving the SAME requests (taken from a dsv4 bench --serve JSON) as well as it can, with the
same metrics (vLLM's definitions: TTFT, TPOT, ITL, E2EL; numpy's percentiles).

How it serves (transformers has no scheduler; this is its own loop, static batches):
  - requests are taken in order in batches of C, all sent at 0; a batch starts when the one before has finished;
  - each request of a batch is prefilled alone (batch 1: an [C, L, L] eager attention of long prompts would not fit),
    its greedy first token is its first output token, timed at the end of its own prefill;
  - the C caches (all of one length: the workload must have fixed input and output lengths) are concatenated
    along the batch, then output_len - 1 greedy decode steps run over the C sequences together, each timed at its
    end (torch.cuda.synchronize after each step: the wall clock a server would see). EOS is ignored.
The weights are random (transformers' init, routing spread as peer_transformers.py does), the layers and maximum
context those of the dsv4 run.

Usage (on the GPU machine):
  python3 bench/peers/peer_serve_transformers.py --like serve.json --json peer-serve.json [--concurrency 1,16]
                                                 [--deadline SECONDS]
A --like file whose requests do not all have one input and one output length is refused (exit 2): run dsv4 with
fixed lengths (--input-len 1024 --output-len 256) for the comparison. The JSON is rewritten after every C.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_transformers import make_config, randomise_routing, write_json_atomic  # noqa: E402

T0 = time.time()


def log(msg):
    print(f"[peer-serve {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def percentile(xs, q):
    """numpy.percentile(xs, q) with linear interpolation, without numpy."""
    xs = sorted(xs)
    if not xs:
        return 0.0
    rank = q / 100 * (len(xs) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (rank - lo) * (xs[hi] - xs[lo])


def dist(xs):
    return {"n": len(xs), "mean_ms": 1e3 * sum(xs) / len(xs) if xs else 0.0, "median_ms": 1e3 * percentile(xs, 50),
            "p99_ms": 1e3 * percentile(xs, 99), "max_ms": 1e3 * max(xs) if xs else 0.0}


def metrics(reqs, token_s):
    """reqs: [(input_len, output_len)], token_s: per request the times of its output tokens (arrivals at 0)."""
    ttft = [t[0] for t in token_s]
    e2el = [t[-1] for t in token_s]
    tpot = [(t[-1] - t[0]) / (len(t) - 1) for t in token_s if len(t) > 1]
    itl = [b - a for t in token_s for a, b in zip(t, t[1:])]
    dur = max(e2el)
    n_in = sum(r[0] for r in reqs)
    n_out = sum(r[1] for r in reqs)
    return {"requests": len(reqs), "duration_s": dur, "input_tokens": n_in, "output_tokens": n_out,
            "request_throughput": len(reqs) / dur, "input_throughput": n_in / dur, "output_throughput": n_out / dur,
            "total_throughput": (n_in + n_out) / dur, "ttft": dist(ttft), "tpot": dist(tpot), "itl": dist(itl),
            "e2el": dist(e2el)}


def cat_caches(torch, caches):
    """One cache holding the C batch-1 caches along the batch: every batch-leading tensor of the cache layers
    concatenated (dicts, lists and tuples walked in step); the first cache object is reused."""
    def cat(vs):
        v = vs[0]
        if torch.is_tensor(v):
            return torch.cat(vs, 0) if v.dim() >= 1 and v.shape[0] == 1 else v
        if isinstance(v, dict):
            return {k: cat([x[k] for x in vs]) for k in v}
        if isinstance(v, list):
            return [cat([x[i] for x in vs]) for i in range(len(v))]
        if isinstance(v, tuple):
            return tuple(cat([x[i] for x in vs]) for i in range(len(v)))
        return v
    out = caches[0]
    for li, layer in enumerate(getattr(out, "layers", [])):
        for k in list(vars(layer)):
            setattr(layer, k, cat([vars(c.layers[li])[k] for c in caches]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--like", required=True, help="a dsv4 bench --serve JSON: layers, max context, the requests")
    ap.add_argument("--json", required=True)
    ap.add_argument("--concurrency", help="comma list: a subset of the --like file's C values (default: all)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--deadline", type=float, default=0, help="seconds; skip a C that would start after it")
    a = ap.parse_args()
    try:
        with open(a.like) as f:
            like = json.load(f)
        if like.get("schema") != "dsv4-bench-serve/1":
            raise KeyError("schema dsv4-bench-serve/1")
        layers, max_ctx = int(like["layers"]), int(like["max_context"])
        work = {}
        for r in like["runs"]:
            work.setdefault(int(r["concurrency"]), [(int(t["input_len"]), int(t["output_len"]))
                                                     for t in r["timelines"]])
    except OSError as e:
        ap.error(f"--like {a.like}: cannot read: {e.strerror}")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        ap.error(f"--like {a.like}: not a dsv4 bench --serve JSON ({type(e).__name__} {e})")
    if a.concurrency:
        try:
            want = [int(x) for x in a.concurrency.split(",")]
        except ValueError:
            ap.error(f"--concurrency {a.concurrency!r}: not a comma list of integers")
        missing = [c for c in want if c not in work]
        if missing:
            ap.error(f"--concurrency: C = {missing[0]} is not in {a.like} (it has {sorted(work)})")
        work = {c: work[c] for c in want}
    for C, reqs in work.items():
        if len(set(reqs)) != 1:
            ap.error(f"--like {a.like}: C = {C} has requests of {len(set(reqs))} different (input, output) lengths; "
                     f"the peer needs fixed lengths (run dsv4 with --input-len A --output-len B)")

    import torch
    import transformers
    from transformers import DynamicCache
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4ForCausalLM

    out = {"schema": "dsv4-bench-serve-peer/1", "peer": "transformers DeepseekV4ForCausalLM, bf16, eager",
           "transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "layers": layers, "max_context": max_ctx, "like": a.like,
           "method": "static batches of C in request order; each prompt prefilled alone; the C caches concatenated; "
                     "greedy decode steps over the batch; EOS ignored; arrivals at 0",
           "runs": [], "failures": []}

    def save():
        out["elapsed_s"] = time.time() - T0
        write_json_atomic(a.json, out)

    torch.manual_seed(a.seed)
    cfg = make_config(DeepseekV4Config, layers, max_ctx)
    cfg._attn_implementation = "eager"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = DeepseekV4ForCausalLM(cfg)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    randomise_routing(torch, model, a.seed)
    log(f"built {layers} layers, bf16, eager")
    save()
    gen = torch.Generator(device="cuda").manual_seed(a.seed + 1)
    for C, reqs in work.items():
        if a.deadline and time.time() - T0 > a.deadline:
            out["failures"].append({"C": C, "error": "skipped: deadline"})
            continue
        n_in, n_out = reqs[0]
        token_s = []
        try:
            torch.cuda.synchronize()
            t0 = time.time()
            with torch.no_grad():
                for b0 in range(0, len(reqs), C):
                    batch = range(b0, min(b0 + C, len(reqs)))
                    caches, last, times = [], [], []
                    for _ in batch:
                        prompt = torch.randint(2, cfg.vocab_size, (1, n_in), generator=gen, device="cuda")
                        cache = DynamicCache(config=model.config)
                        o = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
                        last.append(o.logits[:, -1].argmax(-1))
                        del o
                        torch.cuda.synchronize()
                        times.append([time.time() - t0])
                        caches.append(cache)
                    cache = cat_caches(torch, caches) if len(caches) > 1 else caches[0]
                    tok = torch.stack(last).reshape(len(caches), 1)
                    for _ in range(n_out - 1):
                        o = model(input_ids=tok, past_key_values=cache, use_cache=True)
                        tok = o.logits[:, -1].argmax(-1, keepdim=True)
                        del o
                        torch.cuda.synchronize()
                        now = time.time() - t0
                        for t in times:
                            t.append(now)
                    token_s += times
                    del cache, caches
                    log(f"C={C}: {len(token_s)}/{len(reqs)} requests done")
            m = metrics(reqs, token_s)
            m["concurrency"] = C
            out["runs"].append(m)
            log(f"C={C}: {m['output_throughput']:.1f} output tokens/s, TTFT median {m['ttft']['median_ms']:.0f} ms, "
                f"TPOT median {m['tpot']['median_ms']:.2f} ms")
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            out["failures"].append({"C": C, "error": repr(e)[:500]})
            log(f"C={C}: FAILED: {e!r}")
        torch.cuda.empty_cache()
        save()
    out["complete"] = True
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
