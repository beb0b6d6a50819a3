"""test_writer.py - DumpWriter writes what dump/writer.c writes, pads and refuses as the C probe sink does, and never
leaves a half-written dump under the final name; weights_digest follows the format's rule."""
import hashlib
import os
import shutil
import tempfile
import unittest

import h5py
import numpy as np

import synth
from dsv4dump import DumpError, DumpWriter, schema, weights_digest
from dsv4dump.writer import CHUNK_MAX, chunk_shape


class WriterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dsv4dump-writer-")
        self.cfg_json = synth.config()
        self.cfg = schema.Config(self.cfg_json)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    def writer(self, name="d.h5", **kw):
        args = dict(config_json=self.cfg_json, weights_digest=synth.DIGEST, producer="test", tokens=list(range(32)),
                    prompt_len=21)
        args.update(kw)
        return DumpWriter(self.path(name), **args)

    def test_layout_matches_the_c_writer(self):
        synth.write(self.path("d.h5"))
        with h5py.File(self.path("d.h5"), "r") as f:
            a = f.attrs
            self.assertEqual(a["schema"], "dsv4-dump/1")
            self.assertEqual(a["config_json"], self.cfg_json)  # verbatim
            self.assertEqual(a["weights_digest"], synth.DIGEST)
            self.assertEqual(a["mode"], "forced")
            for k in ("prompt_len", "n_decode"):  # int64 scalars, as dump/writer.c
                self.assertEqual(a[k].dtype, np.dtype("<i8"))
            self.assertEqual((int(a["prompt_len"]), int(a["n_decode"])), (21, 11))
            self.assertIsInstance(a["producer"], str)  # variable-length UTF-8, what h5py and the C writer write
            self.assertEqual(f["tokens"].dtype, np.dtype("<i4"))
            self.assertEqual(f["positions"][()].tolist(), list(range(32)))
            self.assertEqual(f["layers/1"].attrs["attention"], "csa")
            self.assertEqual(f["layers/0"].attrs["mlp"], "hash_moe")
            self.assertEqual(f["layers/2"].attrs["attention"], "hca")
            self.assertIn("final", f)
            d = f["layers/2/out"]
            self.assertEqual(d.shape, (32, 4, 32))
            self.assertEqual(d.dtype, np.dtype("<f4"))
            self.assertEqual(d.compression, "gzip")
            self.assertEqual(d.compression_opts, 4)
            self.assertTrue(d.shuffle)
            self.assertTrue(np.isnan(d.fillvalue))
            self.assertEqual(f["layers/1/topk_idx"].fillvalue, -1)
            self.assertEqual(f["layers/1/topk_idx"].dtype, np.dtype("<i4"))
            self.assertEqual(f["layers/1/compressed_kv"].shape, (8, 16))  # T div 4 entries
            self.assertEqual(f["layers/2/compressed_kv"].shape, (4, 16))  # T div 8
            self.assertEqual(f["layers/1/indexer_scores"].shape, (32, 8))  # (31 + 1) div 4
            row = synth.row_values(self.cfg, 3, "out", 17, 31)
            np.testing.assert_array_equal(f["layers/3/out"][17], row.astype(np.float32))

    def test_chunks_are_whole_rows_and_bounded(self):
        self.assertEqual(chunk_shape((64, 256)), (64, 256))
        self.assertEqual(chunk_shape((10000, 256)), (256, 256))  # 256 KiB of rows
        big = chunk_shape((3, 129280))
        self.assertEqual(big, (1, 129280))
        huge = chunk_shape((2, 4, 1 << 20))  # a row over 1 MiB is split inside
        self.assertLessEqual(int(np.prod(huge)) * 4, CHUNK_MAX)

    def test_unstored_positions_are_ignored_and_subsets_work(self):
        with self.writer(positions=[20, 25, 31]) as w:
            self.assertFalse(w.row(0, "attn_out", 3, np.zeros(32)))
            self.assertTrue(w.row(0, "attn_out", 25, np.ones(32)))
            self.assertEqual(w.rows(0, "attn_out", [20, 21, 31], np.full((3, 32), 2.0)), 2)
            self.assertTrue(w.stores(31) and not w.stores(30))
        with h5py.File(self.path("d.h5"), "r") as f:
            self.assertEqual(f["positions"][()].tolist(), [20, 25, 31])
            self.assertEqual(f["layers/0/attn_out"][:, 0].tolist(), [2.0, 1.0, 2.0])
            self.assertEqual(len(f["layers/0"]), 1)  # a partial dump holds only what was written

    def test_ragged_probes_are_padded(self):
        with self.writer(positions=[11, 31]) as w:
            w.row(1, "indexer_scores", 11, [0.5, 0.25, -1.0])  # 3 visible entries, row of N = 8
            w.row(1, "indexer_scores", 31, np.arange(8.0))
            w.row(1, "topk_idx", 11, [2, 0, 1])
            w.row(1, "topk_idx", 31, np.array([7, 6, 5, 4], dtype=np.int64))
        with h5py.File(self.path("d.h5"), "r") as f:
            s = f["layers/1/indexer_scores"][()]
            self.assertEqual(s.shape, (2, 8))
            self.assertEqual(s[0, :3].tolist(), [0.5, 0.25, -1.0])
            self.assertTrue(np.all(np.isneginf(s[0, 3:])))
            self.assertEqual(f["layers/1/topk_idx"][0].tolist(), [2, 0, 1, -1])

    def test_refuses_what_does_not_fit(self):
        w = self.writer(positions=[11, 31])
        cases = [
            (lambda: w.row(1, "indexer_scores", 11, [0.5, 0.25, 0.1, 9.0]), "entry 3 is not visible"),
            (lambda: w.row(1, "indexer_scores", 31, np.arange(9.0)), "score 8 = 8 is visible"),
            (lambda: w.row(1, "topk_idx", 31, [1, 2, 3, 4, 5]), "at most index_topk = 4"),
            (lambda: w.row(0, "attn_out", 11, np.zeros(31)), "31 values, the row holds 32"),
            (lambda: w.row(0, "indexer_scores", 11, [0.0]), "does not exist on layer 0"),
            (lambda: w.row(0, "atn_out", 11, np.zeros(32)), "unknown layer probe 'atn_out'"),
            (lambda: w.row(7, "attn_out", 11, np.zeros(32)), "layer 7 out of range"),
            (lambda: w.row(0, "compressed_kv", 11, np.zeros(16)), "per entry"),
            (lambda: w.entries(1, "compressed_kv", np.zeros((9, 16))), "expected [n <= 8, 16]"),
            (lambda: w.row(0, "router_ids", 11, [1.5, 2]), "ids must be integers"),
            (lambda: w.row(0, "router_ids", 11, [1 << 40, 2]), "does not fit int32"),
            (lambda: w.row(0, "attn_out", 99, np.zeros(32)), "position 99 out of [0, 32)"),
            (lambda: w.attr("schema", "x"), "set by the writer itself"),
            (lambda: w.set_tokens([0] * 31), "holds 32 tokens"),
        ]
        for fn, msg in cases:
            with self.assertRaises(DumpError) as cm:
                fn()
            self.assertIn(msg, str(cm.exception))
        w.abort()
        self.assertEqual(os.listdir(self.dir), [])

    def test_missing_rows_fail_the_commit_and_leave_nothing(self):
        with self.assertRaises(DumpError) as cm:
            with self.writer(positions=[11, 20, 31]) as w:
                w.row(2, "ffn_out", 20, np.zeros(32))
        self.assertIn("layers/2/ffn_out (2 of 3 positions, e.g. [11, 31])", str(cm.exception))
        self.assertEqual(os.listdir(self.dir), [])

    def test_an_exception_leaves_the_old_file_alone(self):
        with open(self.path("d.h5"), "w") as f:
            f.write("old")
        with self.assertRaises(ZeroDivisionError):
            with self.writer() as w:
                w.row(0, "attn_out", 3, np.zeros(32))
                1 / 0
        self.assertEqual(sorted(os.listdir(self.dir)), ["d.h5"])
        with open(self.path("d.h5")) as f:
            self.assertEqual(f.read(), "old")

    def test_bad_arguments(self):
        os.mkdir(self.path("sub"))
        for kw, msg in [(dict(name="sub"), "names a directory"), (dict(prompt_len=40), "prompt_len 40 for 32"),
                        (dict(mode="sampled"), "mode is 'sampled'"), (dict(weights_digest="ABC"), "64 lowercase hex"),
                        (dict(tokens=[0, 500] * 16), "token 500 outside the vocabulary"),
                        (dict(positions=[3, 3]), "positions must ascend"), (dict(keep=["kvv"]), "unknown probe 'kvv'"),
                        (dict(config_json="{"), "config_json: not JSON"),
                        (dict(config_json='{"vocab_size": 8}'), 'missing required key "hidden_size"')]:
            name = kw.pop("name", "d.h5")
            with self.assertRaises(DumpError) as cm:
                self.writer(name, **kw)
            self.assertIn(msg, str(cm.exception))
        self.assertEqual(os.listdir(self.dir), ["sub"])

    def test_keep_and_greedy_tokens(self):
        with self.writer(keep=["out", "logits"], mode="greedy") as w:
            self.assertEqual(w.rows(0, "attn_out", [0], np.zeros((1, 32))), 0)
            for p in range(32):
                w.row(0, "out", p, np.zeros((4, 32)))
                w.row(None, "logits", p, np.zeros(64))
            w.row(1, "out", 0, np.zeros(128))  # any array of the row's size
            w.set_tokens(list(range(32, 64)))
            for L in (1, 2, 3):
                w.rows(L, "out", range(32), np.zeros((32, 4, 32)))
        with h5py.File(self.path("d.h5"), "r") as f:
            self.assertEqual(sorted(f["layers/0"]), ["out"])
            self.assertEqual(f["tokens"][()].tolist(), list(range(32, 64)))
            self.assertEqual(f.attrs["mode"], "greedy")

    def test_torch_like_tensors(self):
        class Fake:  # what to_numpy relies on: detach(), is_floating_point(), float(), cpu(), numpy()
            def __init__(self, a):
                self.a = a

            def detach(self):
                return self

            def is_floating_point(self):
                return self.a.dtype.kind == "f"

            def float(self):
                return Fake(self.a.astype(np.float32))

            def cpu(self):
                return self

            def numpy(self):
                return self.a
        with self.writer(positions=[5]) as w:
            w.row(0, "attn_out", 5, Fake(np.arange(32, dtype=np.float16)))
            w.row(0, "router_ids", 5, Fake(np.array([3, 1], dtype=np.int64)))
        with h5py.File(self.path("d.h5"), "r") as f:
            self.assertEqual(f["layers/0/attn_out"][0, 31], 31.0)
            self.assertEqual(f["layers/0/router_ids"][0].tolist(), [3, 1])


class DigestTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dsv4dump-digest-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def put(self, name, data):
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)

    def test_single_file(self):
        self.put("model.safetensors", b"abc" * 1000)
        self.put("other.safetensors", b"ignored without an index")
        self.assertEqual(weights_digest(self.dir), hashlib.sha256(b"abc" * 1000).hexdigest())

    def test_sharded_folder_hashes_every_file_in_byte_order(self):
        self.put("model.safetensors.index.json", b"{}")
        self.put("model-00002-of-00002.safetensors", b"two")
        self.put("model-00001-of-00002.safetensors", b"one")
        self.put("Zextra.safetensors", b"Z")  # 'Z' < 'm' byte-wise: first; not named by the index, hashed all the same
        self.assertEqual(weights_digest(self.dir), hashlib.sha256(b"Zonetwo").hexdigest())

    def test_not_a_regular_file(self):
        self.put("model.safetensors.index.json", b"{}")
        os.mkdir(os.path.join(self.dir, "x.safetensors"))
        with self.assertRaises(OSError) as cm:
            weights_digest(self.dir)
        self.assertIn("not a regular file", str(cm.exception))

    def test_writer_computes_it_from_model_dir(self):
        self.put("model.safetensors", b"weights")
        self.put("config.json", synth.config().encode())
        path = os.path.join(self.dir, "d.h5")
        with DumpWriter(path, model_dir=self.dir, producer="t", tokens=[1, 2], prompt_len=2) as w:
            w.rows(0, "out", [0, 1], np.zeros((2, 4, 32)))
        with h5py.File(path, "r") as f:
            self.assertEqual(f.attrs["weights_digest"], hashlib.sha256(b"weights").hexdigest())
            self.assertEqual(f.attrs["config_json"], synth.config())


if __name__ == "__main__":
    unittest.main()
