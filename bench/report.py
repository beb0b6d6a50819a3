#!/usr/bin/env python3
"""report.py - the Markdown table and the SVG chart of a `dsv4 bench` run (and its transformers peer).

  python3 bench/report.py --bench bench.json [--peer peer.json] [--meta gpu.txt] [--commit C] \
      --md results.md --svg chart.svg

The Markdown holds: the run's GPU, driver, CUDA version, date and commit; the headline table (all-on tokens/s per
C and context, with the peer's and the ratio); the ablation table (each variant's ms/step and tokens/s, and its
slow-down against all-on); the index-context baseline; the per-kernel roofline; the context-scaling table; and
what was not measured. The chart (matplotlib, SVG): tokens/s per variant and C at each context (log scale, the
peer as its own bar), and the indexer + top-k time per CSA layer against the live context, live vs max.
"""
import argparse
import json
import os
import sys
import time


def load(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def fmt(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"


def meta_lines(bench, meta_path, commit):
    lines = []
    if meta_path and os.path.exists(meta_path):
        with open(meta_path) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    dev = bench.get("device", {}) if bench else {}
    out = [f"- GPU: {dev.get('name', '?')} ({dev.get('sms', '?')} SMs, {fmt(dev.get('memory_gib'))} GiB)"]
    for ln in lines:
        out.append(f"- {ln}")
    rt = dev.get("cuda_runtime")
    if rt:
        out.append(f"- CUDA runtime {rt // 1000}.{rt % 1000 // 10}, driver API {dev['cuda_driver_api'] // 1000}."
                   f"{dev['cuda_driver_api'] % 1000 // 10}")
    out.append(f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit: {commit or '?'}")
    cl = bench.get("ceilings", {}) if bench else {}
    out.append(f"- ceilings measured in the same run: copy {fmt(cl.get('copy_gbs'), 0)} GB/s (read + written), "
               f"cuBLAS bf16 GEMM {fmt(cl.get('gemm_tflops'), 0)} TFLOP/s")
    return out


def markdown(bench, peer, meta_path, commit):
    md = ["# dsv4 bench results", ""]
    md += meta_lines(bench, meta_path, commit)
    if not bench:
        md += ["", "**No dsv4 bench results** (the run did not produce bench.json)."]
        return "\n".join(md) + "\n"
    m, meth = bench["model"], bench["method"]
    md += [f"- model: Flash shapes, {m['layers']} layers ({', '.join(m['layer_types'])}), random weights "
           f"(seed {m['seed']}), max context {meth['max_context']} (caches allocated for it)",
           f"- state: {meth['state']}; steps start at live context - 128; {meth['warmup']} warm-up + "
           f"{meth['reps']} timed steps; {meth['step_time']}"]
    if peer:
        md.append(f"- peer: {peer['peer']} (transformers {peer['transformers']}, torch {peer['torch']}, attn "
                  f"{peer.get('attn_implementation')}, experts {peer.get('experts_implementation')}); "
                  f"{peer['state']}; {peer['warmup']} + {peer['reps']} steps, torch.cuda.Event")
    if not bench.get("complete"):
        md.append("- **the run was cut short**: only what is listed below ran")
    runs = bench["runs"]
    peer_runs = {(r["C"], r["context"]): r for r in (peer or {}).get("runs", [])}
    # headline
    md += ["", "## Headline: all optimizations on", "",
           "| C | live ctx | ms/step | tokens/s | µs/layer | floor ms | % of floor | transformers tokens/s | × peer |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        if r["variant"] != "all-on":
            continue
        p = peer_runs.get((r["C"], r["context"]))
        md.append(f"| {r['C']} | {r['context']} | {r['ms_median']:.3f} | {r['tokens_per_s']:,.1f} | "
                  f"{r['us_per_layer']:.0f} | {r['floor_ms']:.3f} | {100 * r['fraction_of_floor']:.0f}% | "
                  f"{fmt(p['tokens_per_s']) if p else 'not measured'} | "
                  f"{fmt(r['tokens_per_s'] / p['tokens_per_s']) if p else '-'} |")
    # ablation
    md += ["", "## Ablation (one run): each optimization switched to its naive variant alone", "",
           "| C | live ctx | variant | ms/step (min..max) | tokens/s | × all-on time |", "|---:|---:|---|---:|---:|---:|"]
    on = {(r["C"], r["context"]): r for r in runs if r["variant"] == "all-on"}
    for r in runs:
        a = on.get((r["C"], r["context"]))
        md.append(f"| {r['C']} | {r['context']} | {r['variant']} | {r['ms_median']:.3f} ({r['ms_min']:.3f}.."
                  f"{r['ms_max']:.3f}) | {r['tokens_per_s']:,.1f} | "
                  f"{fmt(r['ms_median'] / a['ms_median'], 2) if a else '-'} |")
    for f in bench.get("failures", []):
        md.append(f"| {f['C']} | - | {f['variant']} | FAILED ({f['stage']}): {f['error'][:120]} | | |")
    base = bench.get("baseline_max_eq_live", [])
    if base:
        md += ["", "## index_context live: max context 1M against max context = live", "",
               "| C | live ctx | ms/step, max 1M | ms/step, max = live | ratio |", "|---:|---:|---:|---:|---:|"]
        for b in base:
            a = on.get((b["C"], b["context"]))
            if a:
                md.append(f"| {b['C']} | {b['context']} | {a['ms_median']:.3f} | {b['ms_median']:.3f} | "
                          f"{a['ms_median'] / b['ms_median']:.3f} |")
    # kernels
    md += ["", "## Roofline per kernel (all on; single launches with a cold L2)", "",
           "bytes = the fewest the launch must move; floor = max(bytes / copy bandwidth, FLOPs / GEMM rate).", "",
           "| C | ctx | kernel | µs | GB/s | % copy bw | TFLOP/s | % of floor |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    bw = bench["ceilings"]["copy_gbs"]
    for r in runs:
        if r["variant"] != "all-on":
            continue
        for k in r.get("kernels", []):
            md.append(f"| {r['C']} | {r['context']} | {k['name']} | {k['us']:.1f} | {k['gbs']:,.0f} | "
                      f"{100 * k['gbs'] / bw:.0f}% | {k['tflops']:.2f} | {100 * k['fraction_of_floor']:.0f}% |")
    sc = bench.get("scaling", [])
    if sc:
        md += ["", f"## Context scaling: indexer + top-k per CSA layer, max context {sc[0]['max_context']}", "",
               "| C | live ctx | live µs (scores + top-k) | max µs (scores + top-k) | max / live |",
               "|---:|---:|---:|---:|---:|"]
        for s in sc:
            lv, mx = s["live_scores_us"] + s["live_topk_us"], s["max_scores_us"] + s["max_topk_us"]
            md.append(f"| {s['C']} | {s['live_context']} | {lv:.1f} ({s['live_scores_us']:.1f} + "
                      f"{s['live_topk_us']:.1f}) | {mx:.1f} ({s['max_scores_us']:.1f} + {s['max_topk_us']:.1f}) | "
                      f"{mx / lv:.1f} |")
    if peer and peer.get("failures"):
        md += ["", "Peer failures / skips: " + "; ".join(
            f"C={f.get('C', '-')} ctx {f.get('context', '-')}: {f.get('error', '')[:160]}" for f in peer["failures"])]
    return "\n".join(md) + "\n"


def chart(bench, peer, svg):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = bench["runs"]
    ctxs = sorted({r["context"] for r in runs})
    Cs = sorted({r["C"] for r in runs})
    variants = []
    for r in runs:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    peer_runs = {(r["C"], r["context"]): r for r in (peer or {}).get("runs", [])}
    labels = variants + (["transformers"] if peer_runs else [])
    ncol = len(ctxs) + (1 if bench.get("scaling") else 0)
    fig, axes = plt.subplots(1, ncol, figsize=(6.2 * ncol, 4.6), squeeze=False)
    width = 0.8 / max(1, len(labels))
    for ai, ctx in enumerate(ctxs):
        ax = axes[0][ai]
        for li, lab in enumerate(labels):
            ys = []
            for C in Cs:
                if lab == "transformers":
                    p = peer_runs.get((C, ctx))
                    ys.append(p["tokens_per_s"] if p else 0)
                else:
                    m = [r for r in runs if r["C"] == C and r["context"] == ctx and r["variant"] == lab]
                    ys.append(m[0]["tokens_per_s"] if m else 0)
            xs = [i + (li - (len(labels) - 1) / 2) * width for i in range(len(Cs))]
            ax.bar(xs, ys, width, label=lab, color="#888888" if lab == "transformers" else None)
        ax.set_xticks(range(len(Cs)))
        ax.set_xticklabels([f"C={C}" for C in Cs])
        ax.set_yscale("log")
        ax.set_ylabel("tokens/s (log)")
        ax.set_title(f"decode tokens/s, live context {ctx}, max {bench['method']['max_context']}")
        ax.grid(axis="y", alpha=0.3)
        if ai == 0:
            ax.legend(fontsize=7)
    if bench.get("scaling"):
        ax = axes[0][-1]
        for C in sorted({s["C"] for s in bench["scaling"]}):
            pts = [s for s in bench["scaling"] if s["C"] == C]
            x = [s["live_context"] for s in pts]
            ax.plot(x, [s["live_scores_us"] + s["live_topk_us"] for s in pts], "o-", label=f"live, C={C}")
            ax.plot(x, [s["max_scores_us"] + s["max_topk_us"] for s in pts], "s--", label=f"max, C={C}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("live context (positions)")
        ax.set_ylabel("µs per CSA layer (log)")
        ax.set_title(f"indexer + top-k, max context {bench['scaling'][0]['max_context']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(svg, format="svg")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--peer")
    ap.add_argument("--meta")
    ap.add_argument("--commit")
    ap.add_argument("--md", required=True)
    ap.add_argument("--svg")
    a = ap.parse_args()
    bench, peer = load(a.bench), load(a.peer)
    with open(a.md, "w") as f:
        f.write(markdown(bench, peer, a.meta, a.commit))
    if a.svg and bench and bench.get("runs"):
        try:
            chart(bench, peer, a.svg)
        except Exception as e:  # noqa: BLE001 - the table still stands
            print(f"report: chart failed: {e!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
