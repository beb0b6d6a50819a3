"""test_tokens.py - `python3 -m dsv4dump tokens`: ids written for `dsv4 run --prompt-tokens`; without the `tokenizers`
package a clear message and exit 2; with it (where installed) the ids of the folder's tokenizer.json."""
import contextlib
import importlib.util
import io
import json
import os
import shutil
import tempfile
import unittest

from dsv4dump.__main__ import main
from dsv4dump.tokens import write_prompt_tokens

HAVE_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None


class TokensTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dsv4dump-tokens-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(args))
        return rc, out.getvalue(), err.getvalue()

    def test_file_format(self):
        path = os.path.join(self.dir, "prompt.txt")
        write_prompt_tokens(path, [0, 17, 255])
        with open(path) as f:
            self.assertEqual(f.read(), "0 17 255\n")
        self.assertEqual(os.listdir(self.dir), ["prompt.txt"])
        with self.assertRaises(ValueError):
            write_prompt_tokens(path, [])

    @unittest.skipIf(HAVE_TOKENIZERS, "the tokenizers package is installed here")
    def test_without_tokenizers(self):
        rc, out, err = self.run_main("tokens", "--tokenizer", self.dir, "hello")
        self.assertEqual(rc, 2)
        self.assertIn("the 'tokenizers' package is not installed", err)
        self.assertEqual(out, "")

    @unittest.skipUnless(HAVE_TOKENIZERS, "needs the tokenizers package")
    def test_with_tokenizers(self):
        from tokenizers import Tokenizer, models, pre_tokenizers
        tok = Tokenizer(models.WordLevel({"<s>": 0, "hello": 5, "world": 7, "[UNK]": 3}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(os.path.join(self.dir, "tokenizer.json"))
        with open(os.path.join(self.dir, "config.json"), "w") as f:
            json.dump({"bos_token_id": 0}, f)
        out_path = os.path.join(self.dir, "p.txt")
        rc, _, err = self.run_main("tokens", "--tokenizer", self.dir, "--out", out_path, "--bos", "hello world x")
        self.assertEqual(rc, 0, err)
        with open(out_path) as f:
            self.assertEqual(f.read(), "0 5 7 3\n")

    def test_missing_folder(self):
        rc, _, err = self.run_main("tokens", "--tokenizer", os.path.join(self.dir, "nope"), "x")
        self.assertEqual(rc, 2)
        self.assertTrue("tokenizers" in err or "no tokenizer.json" in err, err)


if __name__ == "__main__":
    unittest.main()
