"""digest.py - weights_digest, the root attribute that says which weights a dump was made with.

The rule (docs/dump-format.md, model/digest.c): lowercase hex SHA-256 of model.safetensors; for a sharded model
(a model.safetensors.index.json in the folder) of the concatenation of ALL *.safetensors files of the folder in
byte-wise sorted name order, not only the shards the index names. Only regular files are hashed: a FIFO named like a
shard would block the read for ever, so it is an error, as a directory is.
The verifier refuses to compare dumps whose digests differ, so a producer must hash the very files it loaded.
"""
import hashlib
import os
import stat


def weight_files(model_dir):
    """The files the digest hashes, in order (full paths)."""
    if not os.path.exists(os.path.join(model_dir, "model.safetensors.index.json")):
        return [os.path.join(model_dir, "model.safetensors")]
    # byte-wise order, as strcmp: sorting the UTF-8 encoded names is that order for any name
    names = sorted((n for n in os.listdir(model_dir) if n.endswith(".safetensors")), key=os.fsencode)
    return [os.path.join(model_dir, n) for n in names]


def weights_digest(model_dir, chunk=4 << 20):
    """Lowercase hex SHA-256 of the model folder's weights by the rule above. Raises OSError naming the file."""
    h = hashlib.sha256()
    for path in weight_files(model_dir):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path}: not a regular file (weights_digest hashes every *.safetensors file)")
            with os.fdopen(fd, "rb", closefd=False) as f:
                for block in iter(lambda: f.read(chunk), b""):
                    h.update(block)
        finally:
            os.close(fd)
    return h.hexdigest()
