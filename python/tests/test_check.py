"""test_check.py - `python3 -m dsv4dump check`: a consistent dump passes, and each way of breaking one is found with a
message naming the dataset or attribute and the problem (exit 1); a file that is not HDF5 is unreadable (exit 2)."""
import io
import json
import os
import shutil
import tempfile
import unittest

import h5py
import numpy as np

import synth
from dsv4dump.check import check_file, main_check


def set_attr(name, value):
    def edit(f):
        f.attrs[name] = value
    return edit


def del_attr(name):
    def edit(f):
        del f.attrs[name]
    return edit


def set_elem(dataset, index, value):
    def edit(f):
        d = f[dataset]
        a = d[()]
        a[index] = value
        d[...] = a
    return edit


def replace(dataset, fn):
    """Replace dataset by fn(old array) (any shape or dtype)."""
    def edit(f):
        a = f[dataset][()]
        del f[dataset]
        f.create_dataset(dataset, data=fn(a))
    return edit


def transpose_comb(f):
    d = f["layers/2/ffn_hc_comb"]
    d[...] = np.swapaxes(d[()], 1, 2)


def drop(dataset):
    def edit(f):
        del f[dataset]
    return edit


# (what is broken, the edit, a part of the one message check must print). Each is a mistake a producer makes.
BROKEN = [
    ("another schema", set_attr("schema", "dsv4-dump/2"), "schema is 'dsv4-dump/2', this checker reads 'dsv4-dump/1'"),
    ("no weights digest", del_attr("weights_digest"), "missing root attribute 'weights_digest'"),
    ("digest not hex", set_attr("weights_digest", "SHA256:abc"), "is not 64 lowercase hex digits"),
    ("unknown mode", set_attr("mode", "sampled"), "mode is 'sampled', expected 'forced' or 'greedy'"),
    ("prompt_len a string", set_attr("prompt_len", "21"), "root attribute 'prompt_len' is not an integer"),
    ("config not JSON", set_attr("config_json", "{'vocab_size': 64}"), "config_json: not JSON"),
    ("token count", replace("tokens", lambda a: a[:-1]), "/tokens has 31 entries, expected prompt_len 21 + n_decode 11"),
    ("token outside the vocabulary", set_elem("tokens", 5, 64), "/tokens: token 64 at position 5 outside the vocabulary"),
    ("positions not ascending", set_elem("positions", 3, 2), "/positions[3] = 2: positions must ascend"),
    ("layer type attribute", set_attr_group := None, None),  # placeholder replaced below
    ("attn_out one short", replace("layers/1/attn_out", lambda a: a[:, :-1]), "layers/1/attn_out: shape [32, 31], expected [32, 32]"),
    ("out flattened", replace("layers/2/out", lambda a: a.reshape(32, -1)), "the right size but another row shape"),
    ("float64 storage", replace("layers/0/ffn_out", lambda a: a.astype(np.float64)), "layers/0/ffn_out: stored as float64, the schema stores float32"),
    ("NaN in a probe", set_elem("layers/3/ffn_in", (7, 3), np.nan), "layers/3/ffn_in: non-finite values in 1 of 32 rows; first position 7: nan at flat index 3"),
    ("a row never written", set_elem("layers/2/attn_out", 9, np.nan), "(a row never written reads as NaN)"),
    ("score at an invisible entry", set_elem("layers/1/indexer_scores", (10, 5), 0.5), "entry 5 = 0.5 is not visible to the position (w >= (p+1) div 4 = 2) and must be -inf"),
    ("visible score -inf", set_elem("layers/3/indexer_scores", (31, 0), -np.inf), "visible entry 0 is -inf"),
    ("scores on a sliding layer", lambda f: f.create_dataset("layers/0/indexer_scores", data=np.zeros((32, 8), np.float32)), "probe indexer_scores does not exist on layer 0 (attention sliding)"),
    ("pick beyond the visible entries", set_elem("layers/1/topk_idx", (12, 0), 3), "pick 3 outside [-1, 3)"),
    ("pick repeated", set_elem("layers/3/topk_idx", (30, 1), -7), "pick -7 outside"),
    ("too few picks", set_elem("layers/3/topk_idx", (31, 3), -1), "3 picks, expected min(index_topk 4, visible entries 8) = 4"),
    ("expert repeated", lambda f: set_elem("layers/2/router_ids", (4, 1), f["layers/2/router_ids"][4, 0])(f), "layers/2/router_ids: repeated ids in 1 of 32 rows"),
    ("expert out of range", set_elem("layers/0/router_ids", (0, 0), 8), "expert 8 outside [0, 8)"),
    ("weights not scaled", replace("layers/1/router_weights", lambda a: a / 1.5), "weights sum to 1, expected routed_scaling_factor 1.5"),
    ("comb transposed", transpose_comb, "layers/2/ffn_hc_comb: mHC comb not column-normalised"),
    ("pre out of range", set_elem("layers/1/attn_hc_pre", (3, 2), 1.7), "layers/1/attn_hc_pre: mHC pre weights out of range"),
    ("no residual stream", drop("layers/3/out"), "layers/3/out: missing; every dump holds layers/L/out and final/logits"),
    ("no logits", drop("final/logits"), "final/logits: missing"),
    ("too many entries", replace("layers/2/compressed_kv", lambda a: np.concatenate([a, a])), "layers/2/compressed_kv: shape [8, 16], expected [n <= 4, 16]"),
    ("scores too narrow", replace("layers/1/indexer_scores", lambda a: a[:, :7]), "expected [32, 8] (N = (last stored position 31 + 1) div 4)"),
    ("layer group missing", drop("layers/3"), "missing layer groups /layers/L for L in 3"),
]


def attention_attr(f):
    f["layers/2"].attrs["attention"] = "csa"


BROKEN[[b[0] for b in BROKEN].index("layer type attribute")] = (
    "layer type attribute", attention_attr, "/layers/2: attribute attention is 'csa', config_json says 'hca'")


class CheckTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dsv4dump-check-")
        cls.good = os.path.join(cls.dir, "good.h5")
        synth.write(cls.good)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def run_check(self, path, **kw):
        out, err = io.StringIO(), io.StringIO()
        rc = main_check([path], out=out, err=err, **kw)
        return rc, out.getvalue(), err.getvalue()

    def test_good_file_passes(self):
        rc, out, err = self.run_check(self.good)
        self.assertEqual(rc, 0, out + err)
        self.assertIn("ok: dsv4-dump/1, 4 layers (SCHC), 32 tokens (prompt 21 + decode 11, forced), 32 stored "
                      "positions, 68 of 68 probe datasets", out)
        rc, out, _ = self.run_check(self.good, complete=True)
        self.assertEqual(rc, 0, out)

    def test_each_broken_file_is_named(self):
        self.assertGreaterEqual(len(BROKEN), 10)
        for what, edit, msg in BROKEN:
            with self.subTest(what):
                path = os.path.join(self.dir, "broken.h5")
                shutil.copyfile(self.good, path)
                with h5py.File(path, "r+") as f:
                    edit(f)
                rc, out, err = self.run_check(path)
                self.assertEqual(rc, 1, f"{what}: exit {rc}\n{out}{err}")
                self.assertIn(msg, out, f"{what}:\n{out}")
                # one message for one mistake (plus the closing count line)
                problems = [l for l in out.splitlines() if ": note: " not in l and " problem" not in l]
                self.assertEqual(len(problems), 1, f"{what}:\n{out}")

    def test_partial_dump_is_fine_and_says_what_it_omits(self):
        path = os.path.join(self.dir, "partial.h5")
        synth.write(path, positions=[20] + list(range(21, 32)), omit=("kv", "indexer_scores", "compressed_kv",
                                                                        "layers/0/attn_hc_pre"))
        rc, out, _ = self.run_check(path)
        self.assertEqual(rc, 0, out)
        self.assertIn("note: omitted (a partial dump): attn_hc_pre (layer 0), kv (layers 0-3), compressed_kv "
                      "(layers 1-3), indexer_scores (layers 1, 3)", out)
        rc, out, _ = self.run_check(path, complete=True)
        self.assertEqual(rc, 1)
        self.assertIn("missing (--complete): attn_hc_pre (layer 0)", out)

    def test_a_run_too_short_for_an_entry_may_leave_the_pool_out(self):
        path = os.path.join(self.dir, "short.h5")
        synth.write(path, prompt_len=5, n_decode=2, omit=("layers/2/compressed_kv",))  # 7 tokens, HCA ratio 8
        rc, out, _ = self.run_check(path, complete=True)
        self.assertEqual(rc, 0, out)

    def test_extra_datasets_are_notes(self):
        path = os.path.join(self.dir, "extra.h5")
        shutil.copyfile(self.good, path)
        with h5py.File(path, "r+") as f:
            f.create_dataset("layers/1/router_logits", data=np.zeros((32, 8), np.float32))
        rc, out, _ = self.run_check(path)
        self.assertEqual(rc, 0, out)
        self.assertIn("layers/1/router_logits: not a probe of the schema", out)

    def test_unreadable_files(self):
        text = os.path.join(self.dir, "text.h5")
        with open(text, "w") as f:
            f.write("not hdf5\n")
        trunc = os.path.join(self.dir, "trunc.h5")
        with open(self.good, "rb") as f, open(trunc, "wb") as g:
            g.write(f.read()[:3000])
        for path, msg in [(text, "not an HDF5 file"), (trunc, "cannot open as HDF5"),
                          (os.path.join(self.dir, "none.h5"), "no such file"), (self.dir, "not a regular file")]:
            rc, out, err = self.run_check(path)
            self.assertEqual(rc, 2, path)
            self.assertIn(msg, err)

    def test_other_files_do_not_open_as_dumps(self):
        path = os.path.join(self.dir, "plain.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.zeros(3))
        rc, out, _ = self.run_check(path)
        self.assertEqual(rc, 1)
        self.assertIn("missing root attribute 'schema': not a dsv4-dump file?", out)

    def test_result_object(self):
        res = check_file(self.good)
        self.assertEqual(res.problems, [])
        cfg = json.loads(h5py.File(self.good, "r").attrs["config_json"])
        self.assertEqual(cfg["num_hidden_layers"], 4)


if __name__ == "__main__":
    unittest.main()
