#!/usr/bin/env python3
"""report.py - the Markdown table and the SVG chart of a `dsv4 bench` run (and its transformers peer).

  python3 bench/report.py --bench bench.json [--peer peer.json] [--bench-fp8 bench-fp8.json] [--meta gpu.txt] \
      [--commit C] [--note LINE]... --md results.md [--svg chart.svg]

The Markdown holds: the run's GPU, driver, CUDA version, when the report was written and the commit; the headline
table (all-on tokens/s per C and context, with the peer's and the ratio); the ablation table (each variant's
ms/step and tokens/s, and its slow-down against all-on); the index-context baseline; the per-kernel roofline; the
context-scaling table; and what was not measured. The chart (SVG): tokens/s per variant and C at each context (log
scale, the peer as its own bar), and the indexer + top-k time per CSA layer against the live context, live vs max.
The SVG is written directly (no plotting library needed). Both files are written under a temporary name and
renamed when complete.

A --bench, --peer, --bench-fp8 or --meta file that does not exist is left out (run_on_device.sh names them whether
or not that part ran) with a line on stderr; one that is not valid JSON, or lacks a field the tables need, is an
error (exit 2, the file named, nothing written). Exit 1 when --svg was asked for and the chart could not be made.
"""
import argparse
import json
import math
import os
import sys
import time


class ReportError(Exception):
    pass


def load(path, what):
    if not path:
        return None
    if not os.path.exists(path):
        print(f"report: {what} {path}: no such file; left out", file=sys.stderr)
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:  # e.g. cut short by a killed run
        raise ReportError(f"{path}: not valid JSON ({e})") from e


def write_atomic(path, text):
    """Write text to path under a temporary name, renamed when complete."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
    written = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    out.append(f"- report written: {written}; commit of the bf16 run: {commit or '?'}")
    cl = bench.get("ceilings", {}) if bench else {}
    out.append(f"- ceilings measured in the same run: copy {fmt(cl.get('copy_gbs'), 0)} GB/s (read + written), "
               f"cuBLAS bf16 GEMM {fmt(cl.get('gemm_tflops'), 0)} TFLOP/s")
    return out


def fp8_section(bench, fp8, peer):
    """--weights fp8 (FP8 e4m3 linears + FP4 e2m1 experts read by the kernels) beside the bf16 rows, all on."""
    if not fp8 or not fp8.get("runs"):
        return []
    bf = {(r["C"], r["context"]): r for r in bench.get("runs", []) if r["variant"] == "all-on"}
    peer_runs = {(r["C"], r["context"]): r for r in (peer or {}).get("runs", [])}
    lb, lf = bench["model"]["layers"], fp8["model"]["layers"]
    if lb != lf:  # a step of 9 layers against one of 5 says nothing about fp8 against bf16
        bf, peer_runs = {}, {}
    md = ["", "## Weights fp8 (`--weights fp8`: FP8 linears with 128x128 block scales, FP4 experts) against bf16",
          "", "All optimizations on; the same shapes, seed and state; a separate `dsv4 bench --weights fp8` run."
          if lb == lf else f"All optimizations on; a separate `dsv4 bench --weights fp8` run of **{lf} layers**, "
          f"not the bf16 run's {lb}: its steps are not compared with the bf16 rows or the peer.", "",
          "| C | live ctx | bf16 ms/step | fp8 ms/step | fp8 tokens/s | fp8 / bf16 speed | fp8 × peer | "
          "weights per CSA layer bf16 → fp8 (GiB) |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in fp8["runs"]:
        if r["variant"] != "all-on":
            continue
        b = bf.get((r["C"], r["context"]))
        p = peer_runs.get((r["C"], r["context"]))
        if not b:
            md.append(f"| {r['C']} | {r['context']} | - | {r['ms_median']:.3f} | {r['tokens_per_s']:,.1f} | - | - | - |")
            continue
        gib = lambda x: x.get("weight_bytes_rest_then_layers", [0, 0])[1] / 2**30  # [0] is embed/head/rest
        md.append(f"| {r['C']} | {r['context']} | {b['ms_median']:.3f} | {r['ms_median']:.3f} | "
                  f"{r['tokens_per_s']:,.1f} | {fmt(b['ms_median'] / r['ms_median'], 2)} | "
                  f"{fmt(r['tokens_per_s'] / p['tokens_per_s']) if p else '-'} | {gib(b):.2f} → {gib(r):.2f} |")
    for f in fp8.get("failures", []):
        md.append(f"| {f['C']} | - | FAILED ({f['stage']}): {f['error'][:120]} | | | | | |")
    ks = [(r["C"], r["context"], k) for r in fp8["runs"] if r["variant"] == "all-on" for k in r.get("kernels", [])]
    if ks:
        bw = fp8["ceilings"]["copy_gbs"]
        md += ["", "Per kernel, fp8 run (single launches, cold L2):", "",
               "| C | ctx | kernel | µs | GB/s | % copy bw |", "|---:|---:|---|---:|---:|---:|"]
        for C, ctx, k in ks:
            md.append(f"| {C} | {ctx} | {k['name']} | {k['us']:.1f} | {k['gbs']:,.0f} | {100 * k['gbs'] / bw:.0f}% |")
    return md


def markdown(bench, peer, meta_path, commit, notes=(), fp8=None):
    md = ["# dsv4 bench results", ""]
    md += meta_lines(bench, meta_path, commit)
    md += [f"- note: {n}" for n in notes]
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
    md += fp8_section(bench, fp8, peer)
    if peer and peer.get("failures"):
        md += ["", "Peer failures / skips: " + "; ".join(
            f"C={f.get('C', '-')} ctx {f.get('context', '-')}: {f.get('error', '')[:160]}" for f in peer["failures"])]
    return "\n".join(md) + "\n"


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def _esc(t):
    return str(t).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Panel:
    """One plot area with log10 y (and optionally log2 x) axes, written as SVG elements."""

    def __init__(self, x0, y0, w, h, ylo, yhi, title, ylabel, xlabel=""):
        self.x0, self.y0, self.w, self.h = x0, y0, w, h
        self.lylo, self.lyhi = math.floor(math.log10(ylo)), math.ceil(math.log10(yhi))
        if self.lyhi == self.lylo:
            self.lyhi += 1
        self.el = [f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-size="13">{_esc(title)}</text>',
                   f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>',
                   f'<text x="{x0 - 46}" y="{y0 + h / 2}" font-size="11" text-anchor="middle" '
                   f'transform="rotate(-90 {x0 - 46} {y0 + h / 2})">{_esc(ylabel)}</text>',
                   f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" font-size="11" text-anchor="middle">{_esc(xlabel)}</text>']
        for e in range(self.lylo, self.lyhi + 1):
            y = self.y(10 ** e)
            self.el.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
            self.el.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{10.0 ** e:g}</text>')

    def y(self, v):
        lv = math.log10(max(v, 10 ** self.lylo))
        return self.y0 + self.h - (lv - self.lylo) / (self.lyhi - self.lylo) * self.h

    def legend(self, labels, x, y):
        for i, lab in enumerate(labels):
            c = COLORS[i % len(COLORS)] if lab != "transformers" else "#888888"
            self.el.append(f'<rect x="{x}" y="{y + 14 * i}" width="10" height="10" fill="{c}"/>')
            self.el.append(f'<text x="{x + 14}" y="{y + 9 + 14 * i}" font-size="10">{_esc(lab)}</text>')


def chart(bench, peer, svg):
    runs = bench["runs"]
    ctxs = sorted({r["context"] for r in runs})
    Cs = sorted({r["C"] for r in runs})
    variants = []
    for r in runs:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    peer_runs = {(r["C"], r["context"]): r for r in (peer or {}).get("runs", [])}
    labels = variants + (["transformers"] if peer_runs else [])
    scal = bench.get("scaling", [])
    W, H, top = 470, 300, 50
    n = len(ctxs) + (1 if scal else 0)
    panels = []
    vals = [r["tokens_per_s"] for r in runs] + [r["tokens_per_s"] for r in peer_runs.values()]
    vals = [v for v in vals if v > 0] or [1.0]
    for ai, ctx in enumerate(ctxs):
        p = Panel(70 + ai * (W + 110), top, W, H, min(vals), max(vals),
                  f"decode tokens/s, live context {ctx}, max {bench['method']['max_context']}", "tokens/s (log)")
        gw = W / len(Cs)
        bw = 0.8 * gw / max(1, len(labels))
        for ci, C in enumerate(Cs):
            p.el.append(f'<text x="{p.x0 + gw * (ci + 0.5):.1f}" y="{p.y0 + H + 16}" font-size="11" '
                        f'text-anchor="middle">C={C}</text>')
            for li, lab in enumerate(labels):
                if lab == "transformers":
                    m = peer_runs.get((C, ctx))
                    v = m["tokens_per_s"] if m else 0
                else:
                    m = [r for r in runs if r["C"] == C and r["context"] == ctx and r["variant"] == lab]
                    v = m[0]["tokens_per_s"] if m else 0
                if v <= 0:
                    continue
                x = p.x0 + gw * ci + 0.1 * gw + li * bw
                yv = p.y(v)
                c = COLORS[li % len(COLORS)] if lab != "transformers" else "#888888"
                p.el.append(f'<rect x="{x:.1f}" y="{yv:.1f}" width="{bw:.1f}" height="{p.y0 + H - yv:.1f}" '
                            f'fill="{c}"><title>{_esc(lab)} C={C}: {v:.1f} tokens/s</title></rect>')
        if ai == 0:
            p.legend(labels, p.x0 + 6, p.y0 + 6)
        panels.append(p)
    if scal:
        ys = [s[k] for s in scal for k in ("live_scores_us", "live_topk_us", "max_scores_us", "max_topk_us")]
        tot = [s["live_scores_us"] + s["live_topk_us"] for s in scal] + \
              [s["max_scores_us"] + s["max_topk_us"] for s in scal]
        p = Panel(70 + len(ctxs) * (W + 110), top, W, H, min(tot), max(tot),
                  f"indexer + top-k per CSA layer, max context {scal[0]['max_context']}", "us (log)",
                  "live context (positions, log2)")
        xs = sorted({s["live_context"] for s in scal})
        lx0, lx1 = math.log2(xs[0]), math.log2(xs[-1]) if len(xs) > 1 else math.log2(xs[0]) + 1

        def X(v):
            return p.x0 + 10 + (math.log2(v) - lx0) / max(1e-9, lx1 - lx0) * (W - 20)

        for v in xs:
            p.el.append(f'<text x="{X(v):.1f}" y="{p.y0 + H + 16}" font-size="9" text-anchor="middle">'
                        f'{v // 1024}K</text>')
        labs = []
        for ci, C in enumerate(sorted({s["C"] for s in scal})):
            pts = sorted([s for s in scal if s["C"] == C], key=lambda s: s["live_context"])
            for kind, dash in (("live", ""), ("max", ' stroke-dasharray="5,3"')):
                col = COLORS[(2 * ci + (kind == "max")) % len(COLORS)]
                path = " ".join(f"{X(s['live_context']):.1f},{p.y(s[kind + '_scores_us'] + s[kind + '_topk_us']):.1f}"
                                for s in pts)
                p.el.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="2"{dash}/>')
                labs.append(f"{kind}, C={C}")
        p.legend(labs, p.x0 + 6, p.y0 + 6)
        panels.append(p)
    total_w = 70 + n * (W + 110)
    body = "\n".join(e for p in panels for e in p.el)
    write_atomic(svg, f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{top + H + 50}" '
                      f'font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--peer")
    ap.add_argument("--bench-fp8", help="a `dsv4 bench --weights fp8` JSON, tabled beside the bf16 rows")
    ap.add_argument("--meta")
    ap.add_argument("--commit")
    ap.add_argument("--md", required=True)
    ap.add_argument("--svg")
    ap.add_argument("--note", action="append", default=[], help="a line for the header (repeatable)")
    a = ap.parse_args()
    inputs = ", ".join(f"{k} {v}" for k, v in (("--bench", a.bench), ("--peer", a.peer), ("--bench-fp8", a.bench_fp8))
                       if v)
    try:
        bench, peer, fp8 = load(a.bench, "--bench"), load(a.peer, "--peer"), load(a.bench_fp8, "--bench-fp8")
        if a.meta and not os.path.exists(a.meta):
            print(f"report: --meta {a.meta}: no such file; left out", file=sys.stderr)
        try:
            text = markdown(bench, peer, a.meta, a.commit, a.note, fp8)
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, AttributeError) as e:
            raise ReportError(f"the results ({inputs}) lack what the tables need: {type(e).__name__}: {e}") from e
        write_atomic(a.md, text)
    except (ReportError, OSError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if a.svg and not (bench and bench.get("runs")):
        print(f"report: no runs in the bench results: no chart written to {a.svg}", file=sys.stderr)
    elif a.svg:
        try:
            chart(bench, peer, a.svg)
        except Exception as e:  # noqa: BLE001 - the table still stands
            print(f"report: chart failed ({type(e).__name__}: {e}); {a.svg} not written", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
