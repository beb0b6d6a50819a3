#!/usr/bin/python3
"""dump_fault.py - plant a fault into one layer of a candidate dump, the way a bug in that layer would act (issue 40;
docs/verify.md "Faults planted into a dump").

    /usr/bin/python3 tests/support/dump_fault.py IN.h5 OUT.h5 --kind KIND --layer L [--from P] [--scale S]

KIND, applied to layer L's rows at every stored position >= P (default 0):
  attn-scale    attn_out x S (default 1.05): the layer's attention contribution scaled (a wrong softmax scale, a
                missing normalisation)
  kv-rope-sign  kv with the second value of every RoPE pair negated: the key's rotation by -angle (a sign error in
                the key's RoPE); the window then holds the wrong keys, as the candidate's attention would have read them
  topk-drop     topk_idx with its last valid pick set to -1 (CSA layers): one selected entry lost (an off-by-one in
                the top-k's length)
Only layer L's own probes change: what the layers after it read (layer L's `out`) stays the candidate's, so layer-local
replay must flag layer L first and no layer before it. The dump is written under OUT.tmp.<pid> and renamed when
complete; the root attribute `dump_fault` says what was planted. Exit status: 0 planted, 1 nothing to plant (no row at
or after P, or no valid pick), 2 usage or file errors. numpy and h5py of /usr/bin/python3 only.
"""
import argparse
import json
import os
import shutil
import sys

import h5py
import numpy as np


def fail(msg, code=2):
    print(f"dump_fault: {msg}", file=sys.stderr)
    sys.exit(code)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--kind", required=True, choices=["attn-scale", "kv-rope-sign", "topk-drop"])
    ap.add_argument("--layer", type=int, required=True)
    ap.add_argument("--from", dest="first", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.05)
    a = ap.parse_args()
    if not os.path.isfile(a.src):
        fail(f"{a.src}: no such file")
    if os.path.abspath(a.src) == os.path.abspath(a.dst):
        fail(f"{a.dst}: is the input; write the faulty dump elsewhere")
    tmp = f"{a.dst}.tmp.{os.getpid()}"
    shutil.copyfile(a.src, tmp)
    try:
        n = plant(tmp, a)
        if n == 0:
            os.unlink(tmp)
            fail(f"{a.src}: layer {a.layer} has nothing to plant {a.kind} into at positions >= {a.first}", 1)
        os.replace(tmp, a.dst)
    except (OSError, KeyError, ValueError) as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        fail(f"{a.src}: {e}")
    print(f"dump_fault: {a.dst}: {a.kind} at layer {a.layer}, {n} rows from position {a.first}")


def plant(path, a):
    with h5py.File(path, "r+") as f:
        pos = f["positions"][...]
        rows = np.nonzero(pos >= a.first)[0]
        if rows.size == 0:
            return 0
        name = {"attn-scale": "attn_out", "kv-rope-sign": "kv", "topk-drop": "topk_idx"}[a.kind]
        key = f"layers/{a.layer}/{name}"
        if key not in f:
            raise KeyError(f"{key} is not in the dump (layer {a.layer} has no {name})")
        ds = f[key]
        x = ds[rows[0]:, ...]  # rows are ascending positions: everything from the first row at or after P
        n = x.shape[0]
        if a.kind == "attn-scale":
            x = (x * np.float32(a.scale)).astype(np.float32)
        elif a.kind == "kv-rope-sign":
            cfg = json.loads(f.attrs["config_json"])
            rope = int(cfg["qk_rope_head_dim"])
            d = x.shape[-1]
            x[..., d - rope + 1::2] *= np.float32(-1.0)
        else:
            n = 0
            for r in x:
                valid = np.nonzero(r >= 0)[0]
                if valid.size:
                    r[valid[-1]] = -1
                    n += 1
        ds[rows[0]:, ...] = x
        f.attrs["dump_fault"] = f"{a.kind} layer={a.layer} from={a.first}" + (
            f" scale={a.scale}" if a.kind == "attn-scale" else "")
        return n


if __name__ == "__main__":
    main()
