"""test_transformers_write.py - the part of the transformers adapter that runs without torch: Capture.write turns the
rows its hooks keep (raw as transformers gives them: indexer scores as wide as the pool at that forward, top-k picks
without padding, ids int64) into a dump equal, dataset by dataset, to the committed golden/tiny/forced.h5 that
make_golden.py wrote before the hooks moved into the kit. The hooks themselves need torch and transformers: they are
checked on the device machine by golden/adapter_check_on_device.sh (every committed set regenerated bit for bit)."""
import os
import shutil
import tempfile
import types
import unittest
from collections import defaultdict

import h5py
import numpy as np

from dsv4dump import DumpWriter
from dsv4dump.transformers import CSA, Capture, CaptureError

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
GOLDEN = os.path.join(ROOT, "golden", "tiny", "forced.h5")
TF_TYPES = {"sliding": "sliding_attention", "csa": CSA, "hca": "heavily_compressed_attention"}


def raw_capture(f):
    """A Capture whose rows are what the hooks keep for golden/tiny's run (prefill of P, then one token a step)."""
    cap = object.__new__(Capture)  # no hooks: no model, no torch
    P = int(f.attrs["prompt_len"])
    L = len(f["layers"])
    types_ = [TF_TYPES[f[f"layers/{l}"].attrs["attention"]] for l in range(L)]
    cap.cfg = types.SimpleNamespace(layer_types=types_)
    cap.rows = defaultdict(dict)
    cap.entries = {}
    positions = f["positions"][()].tolist()
    for name, d in [(n, f[n]) for g in ["final"] + [f"layers/{l}" for l in range(L)] for n in
                    (f"{g}/{k}" for k in f[g])]:
        probe = name.rsplit("/", 1)[1]
        if probe in ("compressed_kv", "indexer_kv"):
            cap.entries[name] = d[()]
            continue
        a = d[()]
        for i, p in enumerate(positions):
            row = a[i]
            if probe == "indexer_scores":  # the scorer's row is as wide as the pool of that forward
                pool = P // 4 if p < P else (p + 1) // 4
                row = row[:pool].copy()
            elif probe == "topk_idx":  # transformers' picks: min(k, pool), int64, -1 only for invalid prefill picks
                pool = P // 4 if p < P else (p + 1) // 4
                row = row[:min(len(row), pool)].astype(np.int64)
            elif probe == "router_ids":
                row = row.astype(np.int64)
            cap.rows[name][p] = row
    return cap


class WriteTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dsv4dump-tfwrite-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_rows_to_the_committed_golden_bit_for_bit(self):
        out = os.path.join(self.dir, "forced.h5")
        with h5py.File(GOLDEN, "r") as g:
            cap = raw_capture(g)
            with DumpWriter(out, config_json=g.attrs["config_json"], weights_digest=g.attrs["weights_digest"],
                            producer=g.attrs["producer"], tokens=g["tokens"][()], prompt_len=int(g.attrs["prompt_len"]),
                            mode=g.attrs["mode"], positions=g["positions"][()]) as w:
                cap.write(w)
            names = []
            g.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            with h5py.File(out, "r") as o:
                mine = []
                o.visititems(lambda n, x: mine.append(n) if isinstance(x, h5py.Dataset) else None)
                self.assertEqual(sorted(mine), sorted(names))
                for n in names:
                    a, b = g[n][()], o[n][()]
                    self.assertEqual((a.dtype, a.shape), (b.dtype, b.shape), n)
                    self.assertEqual(a.tobytes(), b.tobytes(), n)
        self.assertEqual(len(names), 99)

    def test_a_missing_row_is_refused(self):
        with h5py.File(GOLDEN, "r") as g:
            cap = raw_capture(g)
            del cap.rows["layers/3/ffn_in"][40]
            w = DumpWriter(os.path.join(self.dir, "x.h5"), config_json=g.attrs["config_json"],
                           weights_digest=g.attrs["weights_digest"], producer="t", tokens=g["tokens"][()],
                           prompt_len=int(g.attrs["prompt_len"]))
            with self.assertRaises(CaptureError) as cm:
                cap.write(w)
            self.assertIn("layers/3/ffn_in has no row for positions [40]", str(cm.exception))
            w.abort()
            # a partial write leaves out what was never recorded, and refuses what was recorded in part
            cap.rows.pop("layers/2/kv")
            cap.rows["layers/3/ffn_in"][40] = cap.rows["layers/3/ffn_in"][41]
            with DumpWriter(os.path.join(self.dir, "p.h5"), config_json=g.attrs["config_json"],
                            weights_digest=g.attrs["weights_digest"], producer="t", tokens=g["tokens"][()],
                            prompt_len=int(g.attrs["prompt_len"])) as w:
                cap.write(w, complete=False)
            with h5py.File(os.path.join(self.dir, "p.h5"), "r") as f:
                self.assertNotIn("kv", f["layers/2"])
                self.assertIn("kv", f["layers/1"])


if __name__ == "__main__":
    unittest.main()
