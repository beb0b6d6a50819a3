"""check.py - validate a dsv4-dump/1 file against the schema and its own config_json (`python3 -m dsv4dump check`).

What is checked, each failure one message naming the dataset (or attribute) and the problem:
- the file: HDF5 with schema dsv4-dump/1; root attributes producer, config_json, weights_digest (64 lowercase hex
  digits), mode (forced | greedy) as strings, prompt_len and n_decode as non-negative integers; config_json parses
  and gives the shapes (docs/dump-format.md lists the keys it reads);
- /tokens: 1-D integers, prompt_len + n_decode of them, every one a token of the vocabulary; /positions: 1-D
  integers, at least one, strictly ascending within [0, T);
- /layers/<L>: one group per layer, named by its number, whose attention / mlp attributes agree with the config;
- every probe dataset: a probe of the schema, on a layer whose attention type has it, stored as float32 / int32,
  of the shape the config and /positions give ([R, row...]; per-entry probes [n <= T div ratio, row]);
- values: no NaN/Inf where the schema has none (a row a producer never wrote reads as NaN, or -1 for ids);
  indexer_scores -inf exactly at the entries not visible to the row's position (w >= (p+1) div ratio) and finite
  before; topk_idx ids in [-1, visible), distinct, min(index_topk, visible) of them; router_ids distinct experts in
  [0, n_routed_experts); router_weights >= 0 summing to routed_scaling_factor (norm_topk_prob); mHC pre in
  (0, 1 + eps], post in (0, 2], comb non-negative with columns summing to 1 (Sinkhorn ends on a column step) --
  the value rules use a 2 % slack, so a bf16 producer passes them;
- the probes every dump must hold (layers/L/out, final/logits); with complete=True every probe of the schema.
Notes (not problems): the probes a partial dump omits, extra datasets, fewer compressed entries than the run made.

Datasets are read in slabs of rows (at most ~64 MB at a time), so a large dump is checked in bounded memory.
"""
import os

import numpy as np

from . import schema

SLACK = 0.02  # the value rules' relative slack (bf16 rounding of the stored values)
SLAB_BYTES = 64 << 20


class Unreadable(Exception):
    """The file cannot be read as HDF5 at all (exit status 2)."""


class Result:
    """problems: messages (the dump does not fit the schema); notes: remarks; summary: one line."""

    def __init__(self, path):
        self.path = path
        self.problems = []
        self.notes = []
        self.summary = ""

    def problem(self, msg):
        self.problems.append(msg)

    def note(self, msg):
        self.notes.append(msg)


def _str_attr(f, name, res):
    if name not in f.attrs:
        res.problem(f"missing root attribute '{name}'")
        return None
    v = f.attrs[name]
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            res.problem(f"root attribute '{name}' is not UTF-8 text")
            return None
    if isinstance(v, np.ndarray) and v.shape == () and v.dtype.kind in "OSU":
        v = v[()]
        v = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    if not isinstance(v, str):
        res.problem(f"root attribute '{name}' is not a string (got {type(v).__name__})")
        return None
    return v


def _int_attr(f, name, res):
    if name not in f.attrs:
        res.problem(f"missing root attribute '{name}'")
        return None
    v = f.attrs[name]
    if isinstance(v, np.ndarray):
        if v.size != 1:
            res.problem(f"root attribute '{name}' is an array, expected one integer")
            return None
        v = v.reshape(-1)[0]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        res.problem(f"root attribute '{name}' is not an integer (got {v!r})")
        return None
    if v < 0:
        res.problem(f"root attribute '{name}' = {v} is negative")
        return None
    return int(v)


def _ids(f, name, res):
    """A 1-D integer dataset at the root, as int64, or None (problem noted)."""
    import h5py
    if name not in f:
        res.problem(f"missing dataset /{name}")
        return None
    d = f[name]
    if not isinstance(d, h5py.Dataset) or d.ndim != 1 or d.dtype.kind not in "iu":
        res.problem(f"/{name} must be a 1-D integer dataset")
        return None
    return d[()].astype(np.int64)


def _slabs(d, n_rows):
    """(row0, array) slabs of dataset d covering rows [0, n_rows)."""
    row_bytes = max(1, d.dtype.itemsize * int(np.prod(d.shape[1:])))
    step = max(1, SLAB_BYTES // row_bytes)
    for r0 in range(0, n_rows, step):
        yield r0, d[r0:min(n_rows, r0 + step)]


class _Counter:
    """Counts rows that break one rule of one dataset; one message at the end with the first row."""

    def __init__(self):
        self.n = 0
        self.first = None

    def add(self, what):
        if self.n == 0:
            self.first = what
        self.n += 1


def _value_rules(name, probe, cfg, layer, d, positions, res):
    rules = {}

    def bad(rule, pos, what):
        rules.setdefault(rule, _Counter()).add((pos, what))

    per_entry = probe.per_entry
    n_rows = d.shape[0]
    ratio = cfg.ratio[layer] if layer >= 0 else 0
    for r0, slab in _slabs(d, n_rows):
        for i in range(slab.shape[0]):
            row = slab[i]
            r = r0 + i
            pos = positions[r] if not per_entry else r  # per-entry rows are named by entry
            where = f"entry {r}" if per_entry else f"position {pos}"
            if probe.dtype == "i32":
                row = row.astype(np.int64).reshape(-1)
                if probe.name == "router_ids":
                    k = row.size
                    out = row[(row < 0) | (row >= cfg.n_routed_experts)]
                    if out.size:
                        bad("range", pos, f"{where}: expert {out[0]} outside [0, {cfg.n_routed_experts})"
                            + (" (-1 is the fill value of a row never written)" if out[0] == -1 else ""))
                    elif len(set(row.tolist())) != k:
                        bad("repeat", pos, f"{where}: repeated expert in {row.tolist()}")
                elif probe.name == "topk_idx":
                    vis = (pos + 1) // ratio
                    valid = row[row >= 0]
                    if np.any(row < -1) or (valid.size and valid.max() >= vis):
                        w = row[(row < -1) | (row >= vis)][0]
                        bad("range", pos, f"{where}: pick {w} outside [-1, {vis}) (entries w < (p+1) div {ratio} "
                                          f"are visible)")
                    elif len(set(valid.tolist())) != valid.size:
                        bad("repeat", pos, f"{where}: a pick repeated in {valid.tolist()}")
                    elif valid.size != min(cfg.index_topk, vis):
                        bad("count", pos, f"{where}: {valid.size} picks, expected min(index_topk {cfg.index_topk}, "
                                          f"visible entries {vis}) = {min(cfg.index_topk, vis)}"
                            + (" (a row never written holds only -1)" if valid.size == 0 else ""))
                continue
            row = row.astype(np.float64)
            if probe.name == "indexer_scores":
                vis = min((pos + 1) // ratio, row.size)
                if np.any(np.isnan(row)):
                    bad("nan", pos, f"{where}: NaN at entry {int(np.argmax(np.isnan(row)))}"
                        + (" (a row never written reads as NaN)" if np.all(np.isnan(row)) else ""))
                elif np.any(~np.isneginf(row[vis:])):
                    w = vis + int(np.argmax(~np.isneginf(row[vis:])))
                    bad("invisible", pos, f"{where}: entry {w} = {row[w]:g} is not visible to the position "
                                          f"(w >= (p+1) div {ratio} = {vis}) and must be -inf")
                elif np.any(~np.isfinite(row[:vis])):
                    w = int(np.argmax(~np.isfinite(row[:vis])))
                    bad("visible", pos, f"{where}: visible entry {w} is {row[w]:g}, expected a finite score")
                continue
            if not np.all(np.isfinite(row)):
                j = int(np.argmax(~np.isfinite(row.reshape(-1))))
                bad("nonfinite", pos, f"{where}: {row.reshape(-1)[j]:g} at flat index {j}"
                    + (" (a row never written reads as NaN)" if np.all(np.isnan(row)) else ""))
                continue
            if probe.name in ("attn_hc_pre", "ffn_hc_pre"):
                if np.any(row <= 0) or np.any(row > (1 + cfg.hc_eps) * (1 + SLACK)):
                    bad("pre", pos, f"{where}: {np.round(row, 4).tolist()} outside (0, 1 + hc_eps] "
                                    f"(sigmoid + hc_eps)")
            elif probe.name in ("attn_hc_post", "ffn_hc_post"):
                if np.any(row < 0) or np.any(row > 2 * (1 + SLACK)):
                    bad("post", pos, f"{where}: {np.round(row, 4).tolist()} outside [0, 2] (2 sigmoid)")
            elif probe.name in ("attn_hc_comb", "ffn_hc_comb"):
                cols = row.sum(axis=0)
                if np.any(row < -SLACK) or np.any(np.abs(cols - 1) > SLACK):
                    bad("comb", pos, f"{where}: column sums {np.round(cols, 4).tolist()}, expected 1 (comb[j][k] is "
                                     f"the weight from stream j to stream k; Sinkhorn ends on a column step)")
            elif probe.name == "router_weights":
                if np.any(row < 0):
                    bad("weights", pos, f"{where}: negative weight in {np.round(row, 4).tolist()}")
                elif cfg.norm_topk_prob and abs(row.sum() - cfg.routed_scaling_factor) > \
                        SLACK * cfg.routed_scaling_factor:
                    bad("weights", pos, f"{where}: weights sum to {row.sum():.4g}, expected routed_scaling_factor "
                                        f"{cfg.routed_scaling_factor:g} (normalised, then scaled)")
    labels = {"range": "ids out of range", "repeat": "repeated ids", "count": "wrong number of picks",
              "nan": "NaN scores", "invisible": "scores at entries not yet visible",
              "visible": "visible entries without a finite score", "nonfinite": "non-finite values",
              "pre": "mHC pre weights out of range", "post": "mHC post weights out of range",
              "comb": "mHC comb not column-normalised", "weights": "router weights that do not fit the rule"}
    for rule, c in rules.items():
        pos, what = c.first
        unit = "rows" if not per_entry else "entries"
        res.problem(f"{name}: {labels[rule]} in {c.n} of {n_rows} {unit}; first {what}")


def check_file(path, complete=False):
    """Check one dump; returns a Result. Raises Unreadable when the file cannot be opened as HDF5."""
    import h5py
    res = Result(path)
    if not os.path.exists(path):
        raise Unreadable(f"{path}: no such file")
    if not os.path.isfile(path):
        raise Unreadable(f"{path}: not a regular file")
    try:
        if not h5py.is_hdf5(path):
            raise Unreadable(f"{path}: not an HDF5 file (no HDF5 signature)")
        f = h5py.File(path, "r")
    except Unreadable:
        raise
    except Exception as e:  # a damaged or truncated file
        raise Unreadable(f"{path}: cannot open as HDF5 (damaged or truncated?): {e}") from None
    with f:
        _check_open(f, res, complete)
    return res


def _check_open(f, res, complete):
    import h5py
    sch = _str_attr(f, "schema", res)
    if sch is None:
        res.problems[-1] += ": not a dsv4-dump file?"
        return
    if sch != schema.SCHEMA:
        res.problem(f"schema is '{sch}', this checker reads '{schema.SCHEMA}'")
        return
    producer = _str_attr(f, "producer", res)
    cj = _str_attr(f, "config_json", res)
    digest = _str_attr(f, "weights_digest", res)
    mode = _str_attr(f, "mode", res)
    P = _int_attr(f, "prompt_len", res)
    nd = _int_attr(f, "n_decode", res)
    if producer == "":
        res.problem("root attribute 'producer' is empty")
    if digest is not None and (len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest)):
        res.problem(f"weights_digest '{digest[:80]}' is not 64 lowercase hex digits (the SHA-256 of the weights)")
    if mode is not None and mode not in ("forced", "greedy"):
        res.problem(f"mode is '{mode}', expected 'forced' or 'greedy'")
    cfg = None
    if cj is not None:
        try:
            cfg = schema.Config(cj)
        except schema.ConfigError as e:
            res.problem(f"config_json: {e}")
    tokens = _ids(f, "tokens", res)
    positions = _ids(f, "positions", res)
    T = None
    if tokens is not None and P is not None and nd is not None:
        T = P + nd  # the declared count: positions are checked against it even when /tokens is wrong
        if len(tokens) != T:
            res.problem(f"/tokens has {len(tokens)} entries, expected prompt_len {P} + n_decode {nd} = {P + nd}")
        if cfg is not None:
            out = tokens[(tokens < 0) | (tokens >= cfg.vocab_size)]
            if out.size:
                at = int(np.flatnonzero((tokens < 0) | (tokens >= cfg.vocab_size))[0])
                res.problem(f"/tokens: token {out[0]} at position {at} outside the vocabulary [0, {cfg.vocab_size})")
    if positions is not None:
        if positions.size == 0:
            res.problem("/positions is empty: no rows stored, nothing to compare")
        bad = [i for i in range(len(positions)) if (T is not None and not 0 <= positions[i] < T)
               or positions[i] < 0 or (i and positions[i] <= positions[i - 1])]
        if bad:
            i = bad[0]
            res.problem(f"/positions[{i}] = {positions[i]}: positions must ascend strictly within [0, "
                        f"{T if T is not None else 'T'})")
            positions = None
    if cfg is None or positions is None or T is None or len(positions) == 0:
        res.summary = "not checked further (the problems above stop the shape checks)"
        return
    positions = positions.tolist()
    last = positions[-1]
    R = len(positions)

    # groups
    seen = set()
    if "layers" in f and isinstance(f["layers"], h5py.Group):
        for key, g in f["layers"].items():
            if not (key.isdigit() and str(int(key)) == key) or not isinstance(g, h5py.Group):
                res.problem(f"/layers/{key}: layer groups are named by their number")
                continue
            L = int(key)
            if L >= cfg.num_layers:
                res.problem(f"/layers/{L}: the config has {cfg.num_layers} layers")
                continue
            seen.add(L)
            for attr, want in (("attention", cfg.attention[L]), ("mlp", cfg.mlp[L])):
                got = g.attrs.get(attr)
                got = got.decode() if isinstance(got, bytes) else got
                if got != want:
                    res.problem(f"/layers/{L}: attribute {attr} is {got!r}, config_json says {want!r}")
    elif "layers" in f:
        res.problem("/layers is not a group")
    miss = [L for L in range(cfg.num_layers) if L not in seen]
    if miss:
        res.problem(f"missing layer groups /layers/L for L in {_ranges(miss)} (one per decoder layer)")
    if "final" not in f or not isinstance(f["final"], h5py.Group):
        res.problem("missing group /final")
    for key in f.keys():
        if key not in ("tokens", "positions", "layers", "final"):
            res.note(f"/{key}: not part of the schema (ignored by the verifier)")

    # datasets
    present = []
    for gname in ["final"] + [f"layers/{L}" for L in sorted(seen)]:
        if gname not in f or not isinstance(f[gname], h5py.Group):
            continue
        for key, d in f[gname].items():
            name = f"{gname}/{key}"
            if not isinstance(d, h5py.Dataset):
                res.note(f"{name}: a group inside a layer group (ignored by the verifier)")
                continue
            layer, pname = schema.split_dataset_name(name)
            probe = schema.find_probe(layer, pname)
            if probe is None:
                res.note(f"{name}: not a probe of the schema (an extra: the verifier compares it with the "
                         f"profile's default gates)")
                continue
            present.append(name)
            try:
                row = schema.row_shape(probe, cfg, layer, last)
            except ValueError as e:
                res.problem(f"{name}: {e}")
                continue
            kind = d.dtype.kind
            want_kind = "f" if probe.dtype == "f32" else "i"
            if kind != want_kind or d.dtype.itemsize != 4:
                res.problem(f"{name}: stored as {d.dtype}, the schema stores {probe.dtype.replace('f', 'float').replace('i', 'int')}")
                if (kind == "f") != (want_kind == "f") or kind not in "fiu":
                    continue
            if probe.per_entry:
                max_n = T // cfg.ratio[layer]
                ok = d.ndim == 2 and d.shape[1:] == row and d.shape[0] <= max_n
                if not ok:
                    res.problem(f"{name}: shape {list(d.shape)}, expected [n <= {max_n}, {row[0]}] (entries made over "
                                f"{T} tokens at ratio {cfg.ratio[layer]})")
                    continue
                if d.shape[0] < max_n:
                    res.note(f"{name}: {d.shape[0]} entries of the {max_n} the run made")
            elif d.shape != (R,) + row:
                hint = ""
                if probe.name == "indexer_scores" and d.ndim == 2 and d.shape[0] == R:
                    hint = f" (N = (last stored position {last} + 1) div {cfg.ratio[layer]})"
                elif int(np.prod(d.shape[1:] or (1,))) == int(np.prod(row or (1,))) and d.shape[:1] == (R,):
                    hint = " (the right size but another row shape)"
                res.problem(f"{name}: shape {list(d.shape)}, expected {list((R,) + row)}{hint}")
                continue
            _value_rules(name, probe, cfg, layer, d, positions, res)

    # required and omitted probes
    expected = schema.expected_probes(cfg)

    def no_entries(n):  # a pool with no entry over the run (T < ratio): a producer may leave it out
        layer, probe = schema.split_dataset_name(n)
        return layer >= 0 and schema.find_probe(layer, probe).per_entry and T // cfg.ratio[layer] == 0
    missing = [n for n in expected if n not in present and not no_entries(n)]
    required = [n for n in missing if schema.split_dataset_name(n)[1] in
                (schema.REQUIRED_FINAL_PROBES if n.startswith("final/") else schema.REQUIRED_LAYER_PROBES)]
    for n in required:
        layer = schema.split_dataset_name(n)[0]
        if layer >= 0 and layer in miss:
            continue  # its group is missing: said above
        res.problem(f"{n}: missing; every dump holds layers/L/out and final/logits (docs/dump-format.md "
                    f"\"Partial dumps\")")
    optional = [n for n in missing if n not in required]
    if optional:
        msg = f"omitted (a partial dump): {_group_names(optional)}"
        if complete:
            res.problem(msg.replace("omitted (a partial dump)", "missing (--complete)"))
        else:
            res.note(msg)
    res.summary = (f"{schema.SCHEMA}, {cfg.num_layers} layers ({''.join(t[0].upper() for t in cfg.attention)}), "
                   f"{T} tokens (prompt {P} + decode {nd}, {mode}), {R} stored positions, "
                   f"{len(present)} of {len(expected)} probe datasets")


def _ranges(xs):
    """[0,1,2,5] -> "0-2, 5"."""
    out, i = [], 0
    xs = sorted(xs)
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(f"{xs[i]}" if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)


def _group_names(names):
    """["layers/1/kv", "layers/3/kv", "final/norm"] -> "kv (layers 1, 3), final/norm"."""
    by = {}
    finals = []
    for n in names:
        layer, probe = schema.split_dataset_name(n)
        if layer < 0:
            finals.append(n)
        else:
            by.setdefault(probe, []).append(layer)
    order = {p.name: i for i, p in enumerate(schema.PROBES)}
    parts = [f"{p} (layer{'s' if len(ls) > 1 else ''} {_ranges(ls)})" for p, ls in
             sorted(by.items(), key=lambda kv: order.get(kv[0], 99))]
    return ", ".join(parts + finals)


def main_check(paths, complete=False, quiet=False, out=None, err=None):
    """The `check` command: returns the exit status (0 fine, 1 problems, 2 a file unreadable)."""
    import sys
    out = out or sys.stdout
    err = err or sys.stderr
    status = 0
    for path in paths:
        try:
            res = check_file(path, complete=complete)
        except Unreadable as e:
            print(f"{e}", file=err)
            status = 2
            continue
        for p in res.problems:
            print(f"{path}: {p}", file=out)
        if not quiet:
            for n in res.notes:
                print(f"{path}: note: {n}", file=out)
        if res.problems:
            print(f"{path}: {len(res.problems)} problem{'s' if len(res.problems) != 1 else ''} "
                  f"({res.summary})", file=out)
            status = max(status, 1)
        elif not quiet:
            print(f"{path}: ok: {res.summary}", file=out)
    return status
