#!/usr/bin/env python3
"""mutate_check.py - shows that tests/test_golden.c fails on broken golden data.

For each mutation: copy golden/ into a scratch source tree, break one thing (a duplicate top-k pick, a wrong
digest, a -inf on a visible entry, ...), run the test binary with DSV4_SOURCE_DIR pointing there, and expect
a failure that names the broken thing. The unmodified copy must pass.

  /usr/bin/python3 golden/mutate_check.py build-golden/test_golden       (needs h5py and numpy)

Exit status 0 when the unmodified copy passes and every mutation is caught, 1 otherwise, 2 on bad usage (no
test binary at the path).
"""
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def edit(path, name, fn):
    with h5py.File(path, "r+") as f:
        a = f[name][()]
        fn(a)
        f[name][...] = a


def set_attr(path, obj, key, value):
    with h5py.File(path, "r+") as f:
        f[obj].attrs[key] = value


def del_attr(path, key):
    with h5py.File(path, "r+") as f:
        del f.attrs[key]


def del_dataset(path, name):
    with h5py.File(path, "r+") as f:
        del f[name]


def append_space(path):
    with open(path, "a") as f:
        f.write(" ")


def dup_pick(a):  # tiny forced, last row: second pick = first pick
    a[-1, 1] = a[-1, 0]


def hole_in_picks(a):
    a[-1, 0] = -1


def wrong_pick(a):  # replace the first pick by an entry that was not picked (lower score)
    row = a[-1]
    unpicked = [w for w in range(16) if w not in row]
    row[0] = unpicked[0]


def mutations():
    t = "golden/tiny/forced.h5"
    return [
        ("duplicate top-k pick", lambda d: edit(f"{d}/{t}", "layers/1/topk_idx", dup_pick), "picked twice"),
        ("-1 before a valid pick", lambda d: edit(f"{d}/{t}", "layers/3/topk_idx", hole_in_picks), "after -1"),
        ("pick that is not a top score", lambda d: edit(f"{d}/{t}", "layers/1/topk_idx", wrong_pick),
         "above the lowest pick"),
        ("-inf on a visible entry", lambda d: edit(f"{d}/{t}", "layers/1/indexer_scores",
                                                   lambda a: a.__setitem__((-1, 0), -np.inf)), "indexer_scores"),
        ("finite score on a hidden entry", lambda d: edit(f"{d}/golden/topk512/forced.h5", "layers/3/indexer_scores",
                                                          lambda a: a.__setitem__((0, -1), 1.0)), "not visible"),
        ("NaN in a probe", lambda d: edit(f"{d}/{t}", "layers/2/attn_out",
                                          lambda a: a.__setitem__((5, 3), np.nan)), "attn_out"),
        ("router weights off", lambda d: edit(f"{d}/{t}", "layers/2/router_weights",
                                              lambda a: a.__setitem__((4, 0), a[4, 0] * 1.01)), "weights sum"),
        ("router expert repeated", lambda d: edit(f"{d}/{t}", "layers/2/router_ids",
                                                  lambda a: a.__setitem__((4, 1), a[4, 0])), "twice"),
        ("hash route not tid2eid", lambda d: edit(f"{d}/{t}", "layers/0/router_ids",
                                                  lambda a: a.__setitem__((4, 0), (a[4, 0] + 1) % 8
                                                                          if (a[4, 0] + 1) % 8 not in a[4] else
                                                                          (a[4, 0] + 2) % 8)), "tid2eid"),
        ("mHC comb not doubly stochastic", lambda d: edit(f"{d}/{t}", "layers/3/ffn_hc_comb",
                                                          lambda a: a.__setitem__((2, 0, 0), a[2, 0, 0] + 0.01)),
         "comb column"),
        ("greedy token not the argmax", lambda d: edit(f"{d}/golden/tiny/greedy.h5", "tokens",
                                                       lambda a: a.__setitem__(30, (a[30] + 1) % 256)), "greedy"),
        ("layer attribute", lambda d: set_attr(f"{d}/{t}", "layers/2", "attention", "csa"), "attention"),
        ("weights digest", lambda d: set_attr(f"{d}/{t}", "/", "weights_digest", "0" * 64), "digest"),
        ("producer", lambda d: set_attr(f"{d}/{t}", "/", "producer", "dsv4 0.1 reference cpu fp32"), "producer"),
        ("no seed attribute", lambda d: del_attr(f"{d}/{t}", "seed"), "seed"),
        ("missing probe", lambda d: del_dataset(f"{d}/{t}", "layers/4/kv"), "layers/4/kv"),
        ("config.json not the dump's", lambda d: append_space(f"{d}/golden/tiny/config.json"), "config"),
        ("fp8 block scale off by 2x", lambda d: bump_scale(f"{d}/golden/tiny-fp8/model.safetensors",
                                                           "layers.1.attn.wq_b.scale"), "wq_b"),
        ("fp4 expert scale off by 2x", lambda d: bump_scale(f"{d}/golden/tiny-fp8/model.safetensors",
                                                            "layers.3.ffn.experts.7.w2.scale"), "experts"),
    ]


def bump_scale(path, name):
    """Add one to every e8m0 byte of `name` (doubles its scales): the file stays well-formed."""
    import json
    import struct
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        b, e = h[name]["data_offsets"]
        f.seek(8 + n + b)
        raw = bytearray(f.read(e - b))
        f.seek(8 + n + b)
        f.write(bytes(x + 1 for x in raw))


def run(binary, src):
    env = dict(os.environ, DSV4_SOURCE_DIR=src, CK_DEFAULT_TIMEOUT="600")
    p = subprocess.run([binary], env=env, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    if len(sys.argv) > 2 or len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if len(sys.argv) > 2 else sys.stdout)
        return 2 if len(sys.argv) > 2 else 0
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build-golden/test_golden"))
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        print(f"mutate_check: {binary}: no test_golden binary there (build it, or give its path)", file=sys.stderr)
        return 2
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        def fresh():
            src = os.path.join(tmp, "src")
            shutil.rmtree(src, ignore_errors=True)
            os.makedirs(src)
            shutil.copytree(os.path.join(ROOT, "golden"), os.path.join(src, "golden"),
                            ignore=shutil.ignore_patterns("*.py", "__pycache__"))
            return src
        rc, out = run(binary, fresh())
        print(f"{'unmodified':32s} rc {rc} ({'passes' if rc == 0 else 'FAILS: ' + out[-500:]})")
        bad += rc != 0
        for label, mutate, needle in mutations():
            src = fresh()
            try:
                mutate(src)
            except Exception as e:  # noqa: BLE001 - a mutation that no longer applies is a problem, not a crash
                print(f"{label:32s} NOT APPLIED: {type(e).__name__}: {e}")
                bad += 1
                continue
            rc, out = run(binary, src)
            lines = [l for l in out.splitlines() if ":F:" in l or ":E:" in l]
            caught = rc != 0 and any(needle in l for l in lines)
            print(f"{label:32s} rc {rc} {'caught' if caught else 'NOT CAUGHT'}: {len(lines)} failing checks, "
                  f"e.g. {lines[0].split(':', 4)[-1][:110] if lines else '-'}")
            bad += not caught
    print(f"{bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
