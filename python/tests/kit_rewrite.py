"""kit_rewrite.py SRC DST --model DIR [--omit NAMES] [--positions decode|all|LIST] [--producer P]

Re-writes every row of dump SRC through dsv4dump.DumpWriter into DST, one row() call per (layer, probe, position)
and one entries() call per pool, the way an engine's hooks would feed the kit. config_json and weights_digest come
from the model folder DIR (the kit computes the digest), not from SRC: a digest rule that differs from dsv4's makes
`dsv4 verify` refuse the pair. --omit drops probes (names or dataset paths, comma separated): a partial dump.
--positions keeps a subset of SRC's stored positions ("decode": the last prompt position and every decode one).
Used by tests/e2e_kit_verify.sh.
"""
import argparse
import fnmatch
import sys

import h5py

from dsv4dump import DumpWriter, schema


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--model", required=True)
    ap.add_argument("--omit", default="")
    ap.add_argument("--positions", default="all")
    ap.add_argument("--producer", default="dsv4dump kit_rewrite")
    a = ap.parse_args()
    omit = [g for g in a.omit.split(",") if g]
    with h5py.File(a.src, "r") as f:
        P = int(f.attrs["prompt_len"])
        tokens = f["tokens"][()]
        src_pos = f["positions"][()].tolist()
        mode = f.attrs["mode"]
        if a.positions == "all":
            keep = src_pos
        elif a.positions == "decode":
            keep = [p for p in src_pos if p >= P - 1]
        else:
            want = {int(x) for x in a.positions.split(",")}
            keep = [p for p in src_pos if p in want]
        row_of = {p: i for i, p in enumerate(src_pos)}
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and "/" in n else None)
        with DumpWriter(a.dst, model_dir=a.model, producer=a.producer, tokens=tokens, prompt_len=P, mode=mode,
                        positions=keep) as w:
            for name in names:
                layer, probe = schema.split_dataset_name(name)
                if any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(probe, g) for g in omit):
                    continue
                d = f[name]
                if schema.find_probe(layer, probe).per_entry:
                    w.entries(layer, probe, d[()])
                    continue
                for p in keep:
                    w.row(None if layer < 0 else layer, probe, p, d[row_of[p]])
    print(f"kit_rewrite: {a.src} -> {a.dst}: {len(keep)} positions, omitted {omit or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
