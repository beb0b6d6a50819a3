"""tokens.py - prompts as text: token ids for `dsv4 run --prompt-tokens FILE` (`python3 -m dsv4dump tokens`).

The ids come from the model's own tokenizer.json through the `tokenizers` package (Hugging Face's; not a
dependency of the kit: the command says so and exits 2 when it is missing). The file holds the ids on one line,
separated by spaces (what `dsv4 run --prompt-tokens` reads), written to a temporary name and renamed.
Quiet trap: whether a BOS token starts the prompt is the tokenizer's post-processor's business; DeepSeek's chat
models expect one, so --bos prepends bos_token_id (config.json or tokenizer_config.json of the folder) unless the
encoding already starts with it.
"""
import json
import os


class TokenizerMissing(RuntimeError):
    """The `tokenizers` package is not installed."""


def _bos_id(tok, folder):
    cfg = os.path.join(folder, "config.json")
    if os.path.exists(cfg):
        with open(cfg, encoding="utf-8") as f:
            bos = json.load(f).get("bos_token_id")
        if isinstance(bos, int):
            return bos
    tcfg = os.path.join(folder, "tokenizer_config.json")
    if os.path.exists(tcfg):
        with open(tcfg, encoding="utf-8") as f:
            bos = json.load(f).get("bos_token")
        if isinstance(bos, dict):
            bos = bos.get("content")
        if isinstance(bos, str) and tok.token_to_id(bos) is not None:
            return tok.token_to_id(bos)
    raise ValueError(f"{folder}: no bos_token_id in config.json and no bos_token in tokenizer_config.json")


def encode(folder, text, bos=False, special_tokens=True):
    """Token ids of `text` with the tokenizer.json of `folder` (a model folder or the file itself)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerMissing("the 'tokenizers' package is not installed (pip install tokenizers); it reads the "
                               "model's tokenizer.json") from None
    path = folder if os.path.isfile(folder) else os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no tokenizer.json there")
    tok = Tokenizer.from_file(path)
    ids = tok.encode(text, add_special_tokens=special_tokens).ids
    if bos:
        b = _bos_id(tok, os.path.dirname(path))
        if not ids or ids[0] != b:
            ids = [b] + list(ids)
    return [int(i) for i in ids]


def write_prompt_tokens(path, ids):
    """Write ids as one line of space-separated integers (dsv4 run --prompt-tokens), via a temporary name."""
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("no tokens: a prompt needs at least one")
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(" ".join(str(i) for i in ids) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
