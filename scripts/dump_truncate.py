#!/usr/bin/python3
"""dump_truncate.py IN.h5 OUT.h5 --tokens N - the first N tokens of a dump, as the run of those N tokens would have
dumped them (issue 40; scripts/replay_on_device.sh): /tokens cut to N, the stored positions below N with their rows,
`indexer_scores` cut to the entries visible to the last position kept ((last + 1) div ratio), every per-entry dataset
cut to the entries closed by N (N div ratio), prompt_len = min(prompt_len, N) and n_decode the rest.

Why this is a run of N tokens: the model is causal, so what a run computes at positions < N depends on tokens 0..N-1
only; the optimized path feeds a prompt one token per step, so its prompt positions are its decode steps either way.
What may differ is only what depends on the allocated context (the optimized path sizes its caches for the whole run:
--index-context max scores the whole allocated indexer pool), so a naive variant that reads it should be run at N.

Written under OUT.tmp.<pid> (gzip level 1), renamed when complete; the root attribute `truncated_from` says from what.
numpy and h5py of /usr/bin/python3 only. Exit status 0, 2 on a usage or file error.
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np

ENTRY_PROBES = ("compressed_kv", "indexer_kv")


def fail(msg):
    print(f"dump_truncate: {msg}", file=sys.stderr)
    sys.exit(2)


def write(dst, name, data):
    dst.create_dataset(name, data=data, compression="gzip", compression_opts=1, shuffle=True,
                       chunks=True if data.size else None)


def truncate(src_path, dst_path, n):
    with h5py.File(src_path, "r") as s, h5py.File(dst_path, "w") as d:
        tokens = s["tokens"][...]
        if n < 1 or n > tokens.shape[0]:
            raise ValueError(f"--tokens {n}: the dump has {tokens.shape[0]} tokens")
        pos = s["positions"][...]
        keep = int(np.count_nonzero(pos < n))
        if keep == 0:
            raise ValueError(f"no stored position below {n}")
        last = int(pos[keep - 1])
        cfg = json.loads(s.attrs["config_json"])
        rates = cfg.get("compress_rates") or {}
        ratio_of = {"csa": int(rates.get("compressed_sparse_attention", 4)),
                    "hca": int(rates.get("heavily_compressed_attention", 128)), "sliding": 0}
        for k, v in s.attrs.items():
            d.attrs[k] = v
        p = int(s.attrs["prompt_len"])
        d.attrs["prompt_len"] = np.array(min(p, n), dtype=np.asarray(s.attrs["prompt_len"]).dtype)
        d.attrs["n_decode"] = np.array(n - min(p, n), dtype=np.asarray(s.attrs["n_decode"]).dtype)
        d.attrs["truncated_from"] = f"{os.path.basename(src_path)}: the first {n} of {tokens.shape[0]} tokens"
        write(d, "tokens", tokens[:n])
        write(d, "positions", pos[:keep])
        for gname in ["final"] + [f"layers/{k}" for k in s["layers"].keys()]:
            g = s[gname]
            og = d.require_group(gname)
            for k, v in g.attrs.items():
                og.attrs[k] = v
            ratio = ratio_of.get(str(g.attrs.get("attention", "sliding")), 0)
            for name, ds in g.items():
                if name in ENTRY_PROBES:
                    if ratio <= 0:
                        raise ValueError(f"{gname}/{name}: entries on a layer without a compress ratio")
                    data = ds[: n // ratio]
                elif name == "indexer_scores":
                    data = ds[:keep, : (last + 1) // ratio]
                else:
                    data = ds[:keep]
                write(d, f"{gname}/{name}", data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--tokens", type=int, required=True)
    a = ap.parse_args()
    if os.path.abspath(a.src) == os.path.abspath(a.dst):
        fail(f"{a.dst}: is the input")
    tmp = f"{a.dst}.tmp.{os.getpid()}"
    try:
        truncate(a.src, tmp, a.tokens)
        os.replace(tmp, a.dst)
    except (OSError, KeyError, ValueError) as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        fail(f"{a.src}: {e}")
    print(f"dump_truncate: {a.dst}: the first {a.tokens} tokens of {a.src}")


if __name__ == "__main__":
    main()
