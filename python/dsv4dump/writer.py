"""writer.py - DumpWriter: write a dsv4-dump/1 file from Python, laid out as dsv4's own C writer lays it out.

    with DumpWriter("out.h5", model_dir="golden/tiny", producer="myengine 1.0 bf16 tp1",
                    tokens=ids, prompt_len=21) as w:
        w.row(3, "attn_out", position, values)          # one row, keyed by (layer, probe, position)
        w.rows(3, "ffn_out", positions, array)          # several rows of one forward at once
        w.entries(2, "compressed_kv", pool)             # a per-entry probe, whole, once
        w.row(None, "logits", position, logits_row)     # /final probes: layer None (or -1)

Layout (dump/writer.c, docs/dump-format.md): the root attributes schema, producer, config_json, weights_digest,
mode (variable-length UTF-8 strings) and prompt_len, n_decode (int64 scalars); /tokens and /positions int32,
contiguous; /layers/<L> groups with `attention` and `mlp` attributes from the config, and /final; every probe
dataset float32 or int32, chunked by whole rows (about 256 KiB, never over 1 MiB), shuffle + gzip 4, fill value
NaN / -1, so a row that never arrives reads as NaN / -1 and not as zeros. The file is built as
"<path>.tmp.<pid>" and renamed over <path> only when the `with` block ends without an exception (commit()); an
exception, or abort(), removes it, so a crash never leaves a half-written dump under its name.

What the writer enforces, so that a dump it commits reads back as what was meant:
- a probe name of the schema, on a layer whose attention type has it, with as many values as its row holds (any
  array of that size: a [4, 1] post is taken as [4]); floats are stored as float32, ids as int32 (they must fit);
- the two ragged probes are padded as the C probe sink pads them: indexer_scores rows may hold fewer than N
  entries (N = entries at the last stored position), the rest is -inf, and entries past N must be -inf already;
  topk_idx rows may hold fewer than index_topk ids, the rest is -1;
- indexer_scores entries not visible to the row's position (w >= (p+1) div ratio) must be -inf: engines leave
  garbage there (vLLM, SGLang and TensorRT-LLM do not clean the columns past a row's entry count); mask them first;
- a per-position dataset, once created, gets a row for every stored position before commit: a missing row is an
  error naming the dataset and positions. A probe a producer cannot give is simply never written (a partial
  dump; the verifier lists what the candidate lacks).
Rows at positions the dump does not store are ignored (row() returns False), so hooks can write every position.

numpy and h5py only; a torch tensor is accepted (detached, bf16/f16 widened to float32, moved to the CPU) without
this module importing torch.
"""
import os
import stat

import numpy as np

from . import schema
from . import digest as _digest

CHUNK_TARGET = 256 * 1024  # bytes a chunk aims for: several small rows per chunk
CHUNK_MAX = 1024 * 1024    # a chunk is never larger: a huge row is split
GZIP_LEVEL = 4
RESERVED_ATTRS = ("schema", "producer", "config_json", "weights_digest", "prompt_len", "n_decode", "mode")


class DumpError(RuntimeError):
    """A row or a dump that does not fit the schema; the message names the file, dataset and position."""


def chunk_shape(shape):
    """Chunk dims for a float32/int32 dataset of `shape` (shape[0] = rows): whole rows, ~CHUNK_TARGET bytes, at
    most CHUNK_MAX bytes (dump/writer.c dsv4_dump_chunk)."""
    chunk = list(shape)
    row_bytes = 4
    for d in shape[1:]:
        row_bytes *= d
    rows = CHUNK_TARGET // row_bytes if row_bytes < CHUNK_TARGET else 1
    if shape[0] > 0 and rows > shape[0]:
        rows = shape[0]
    chunk[0] = max(1, rows)
    for i in range(1, len(shape)):
        inner = 4
        for d in chunk[i + 1:]:
            inner *= d
        if chunk[i] * inner > CHUNK_MAX:
            chunk[i] = max(1, CHUNK_MAX // inner)
    return tuple(chunk)


def to_numpy(x):
    """A numpy array of x (an array, a list, a number or a torch tensor; torch is not imported)."""
    if hasattr(x, "detach") and hasattr(x, "is_floating_point"):
        x = x.detach()
        if x.is_floating_point():
            x = x.float()
        x = x.cpu().numpy()
    return np.asarray(x)


class DumpWriter:
    """A dsv4-dump/1 file being written (see the module text). Use it as a context manager, or call commit() /
    abort() yourself.

    path         the dump's final name
    model_dir    the model folder: config.json is read verbatim and weights_digest computed from its
                 *.safetensors (docs/dump-format.md), unless config_json / weights_digest are given
    producer     who wrote it, with version and precision, e.g. "vllm 0.19 bf16 tp8 H200"
    tokens       the token fed at each position, prompt then decode (T = prompt_len + n_decode)
    prompt_len   P: tokens consumed by the prefill
    mode         "forced" (decode tokens given) or "greedy" (each step fed its own argmax; set_tokens() may
                 replace /tokens before commit)
    positions    the positions whose rows are stored, ascending (default: all of 0..T-1)
    attrs        extra root string attributes (e.g. {"command": ..., "engine_flags": ...})
    keep         only these probe names are stored (others are dropped silently), e.g. ("out", "logits")
    """

    def __init__(self, path, *, producer, tokens, prompt_len, model_dir=None, config_json=None,
                 weights_digest=None, mode="forced", positions=None, attrs=None, keep=None):
        import h5py  # here, so that `import dsv4dump` works where h5py is missing (the tokens command)

        self.path = os.fspath(path)
        if config_json is None:
            if model_dir is None:
                raise DumpError(f"{self.path}: give model_dir or config_json")
            with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
                config_json = f.read()
        if weights_digest is None:
            if model_dir is None:
                raise DumpError(f"{self.path}: give model_dir or weights_digest")
            weights_digest = _digest.weights_digest(model_dir)
        try:
            self.cfg = schema.Config(config_json)
        except schema.ConfigError as e:
            raise DumpError(f"{self.path}: config_json: {e}") from None
        tokens = [int(t) for t in to_numpy(tokens).reshape(-1)]
        T = len(tokens)
        if not 0 <= prompt_len <= T:
            raise DumpError(f"{self.path}: prompt_len {prompt_len} for {T} tokens")
        if mode not in ("forced", "greedy"):
            raise DumpError(f"{self.path}: mode is {mode!r}, expected 'forced' or 'greedy'")
        if not isinstance(producer, str) or not producer:
            raise DumpError(f"{self.path}: producer must be a non-empty string")
        if not isinstance(weights_digest, str) or len(weights_digest) != 64 or \
                any(c not in "0123456789abcdef" for c in weights_digest):
            raise DumpError(f"{self.path}: weights_digest must be 64 lowercase hex digits (SHA-256)")
        self._check_ids(tokens, "/tokens")
        positions = list(range(T)) if positions is None else [int(p) for p in positions]
        for i, p in enumerate(positions):
            if not 0 <= p < T or (i and p <= positions[i - 1]):
                raise DumpError(f"{self.path}: positions[{i}] = {p}: positions must ascend within [0, {T})")
        self.T, self.prompt_len, self.positions = T, int(prompt_len), positions
        self.row_of = {p: i for i, p in enumerate(positions)}
        self.last_pos = positions[-1] if positions else -1
        self.keep = None if keep is None else set(keep)
        if self.keep is not None:
            unknown = sorted(k for k in self.keep if k not in schema.LAYER_PROBES and k not in schema.FINAL_PROBES)
            if unknown:
                raise DumpError(f"{self.path}: keep: unknown probe {unknown[0]!r} (docs/dump-format.md lists them)")
        self.written = {}  # dataset name -> bool[R] (rows written) or None (per-entry, whole)
        if self.path.endswith("/") or os.path.isdir(self.path):
            raise DumpError(f"{self.path}: names a directory; give the dump's file name")
        if os.path.exists(self.path) and not stat.S_ISREG(os.stat(self.path).st_mode):
            raise DumpError(f"{self.path}: exists and is not a regular file; the dump would replace it")
        self.tmp_path = f"{self.path}.tmp.{os.getpid()}"
        self.f = h5py.File(self.tmp_path, "w")
        try:
            self._layout(config_json, weights_digest, producer, mode, tokens, attrs or {})
        except BaseException:
            self.abort()
            raise

    # -- layout
    def _layout(self, config_json, digest, producer, mode, tokens, attrs):
        a = self.f.attrs
        a["schema"] = schema.SCHEMA
        a["producer"] = producer
        a["config_json"] = config_json
        a["weights_digest"] = digest
        a.create("prompt_len", self.prompt_len, dtype="<i8")
        a.create("n_decode", self.T - self.prompt_len, dtype="<i8")
        a["mode"] = mode
        for k, v in attrs.items():
            self.attr(k, v)
        self.f.create_dataset("tokens", data=np.asarray(tokens, dtype="<i4").reshape(-1), fillvalue=np.int32(-1))
        self.f.create_dataset("positions", data=np.asarray(self.positions, dtype="<i4").reshape(-1),
                              fillvalue=np.int32(-1))
        for layer in range(self.cfg.num_layers):
            g = self.f.create_group(f"layers/{layer}")
            g.attrs["attention"] = self.cfg.attention[layer]
            g.attrs["mlp"] = self.cfg.mlp[layer]
        self.f.create_group("final")

    def _check_ids(self, ids, what):
        bad = [t for t in ids if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise DumpError(f"{self.path}: {what}: token {bad[0]} outside the vocabulary [0, {self.cfg.vocab_size})")

    def _dataset(self, name, dtype, shape, per_entry):
        h5type = "<f4" if dtype == "f32" else "<i4"
        fill = np.float32(np.nan) if dtype == "f32" else np.int32(-1)
        empty = any(d == 0 for d in shape[1:]) or (shape[0] == 0 and not per_entry)
        if empty:  # a zero-length row dim cannot be chunked: it holds no data, so contiguous and unfiltered
            return self.f.create_dataset(name, shape=shape, dtype=h5type, fillvalue=fill)
        maxshape = ((None,) + tuple(shape[1:])) if per_entry else None
        return self.f.create_dataset(name, shape=shape, dtype=h5type, chunks=chunk_shape(shape), maxshape=maxshape,
                                     compression="gzip", compression_opts=GZIP_LEVEL, shuffle=True, fillvalue=fill)

    # -- rows
    def stores(self, position):
        """Whether rows at `position` are stored (a hook may skip computing a costly probe elsewhere)."""
        return int(position) in self.row_of

    def _probe(self, layer, name, per_entry):
        layer = -1 if layer is None else int(layer)
        probe = schema.find_probe(layer, name)
        if probe is None:
            raise DumpError(f"{self.path}: unknown {'final' if layer < 0 else 'layer'} probe {name!r} "
                            f"(docs/dump-format.md lists the names)")
        if probe.per_entry != per_entry:
            raise DumpError(f"{self.path}: probe {name} is {'per entry: use entries()' if probe.per_entry else 'per position: use row()/rows()'}")
        try:
            shape = schema.row_shape(probe, self.cfg, layer, self.last_pos)
        except ValueError as e:
            raise DumpError(f"{self.path}: {e}") from None
        return layer, probe, shape

    def _fit(self, dname, probe, layer, shape, position, v):
        """The row `v` as stored: converted, padded (ragged probes) and checked."""
        size = int(np.prod(shape)) if shape else 1
        where = f"{self.path}: {dname} at position {position}"
        if probe.dtype == "i32":
            if v.size and not np.issubdtype(v.dtype, np.integer):
                if not np.all(np.isfinite(v)) or np.any(v != np.round(v)):
                    raise DumpError(f"{where}: ids must be integers")
            v = v.reshape(-1).astype(np.int64)
            if v.size and (v.min() < -2**31 or v.max() >= 2**31):
                raise DumpError(f"{where}: an id does not fit int32")
            if probe.name == "topk_idx":
                if v.size > size:
                    raise DumpError(f"{where}: {v.size} ids, at most index_topk = {size}")
                v = np.concatenate([v, np.full(size - v.size, -1, np.int64)])
            elif v.size != size:
                raise DumpError(f"{where}: {v.size} values, the row holds {size} {list(shape)}")
            return v.astype("<i4").reshape(shape)
        v = v.reshape(-1).astype(np.float32)
        if probe.name == "indexer_scores":
            N = size
            if v.size > N and not np.all(np.isneginf(v[N:])):
                w = N + int(np.argmax(~np.isneginf(v[N:])))
                raise DumpError(f"{where}: {v.size} scores, the row holds {N} (entries at the last stored position "
                                f"{self.last_pos}) and score {w} = {v[w]:g} is visible")
            row = np.full(N, -np.inf, np.float32)
            row[:min(N, v.size)] = v[:N]
            vis = (position + 1) // self.cfg.ratio[layer]
            if np.any(~np.isneginf(row[vis:])):
                w = vis + int(np.argmax(~np.isneginf(row[vis:])))
                raise DumpError(f"{where}: entry {w} is not visible to position {position} (entries w < (p+1) div "
                                f"{self.cfg.ratio[layer]} = {vis} are) but holds {row[w]:g}: store -inf there")
            return row
        if v.size != size:
            raise DumpError(f"{where}: {v.size} values, the row holds {size} {list(shape)}")
        return v.reshape(shape)

    def row(self, layer, probe, position, values):
        """Store one row of a per-position probe. layer: the decoder layer, or None / -1 for /final probes.
        Returns True when stored, False when the position is not stored (or the probe not kept)."""
        return self.rows(layer, probe, [position], to_numpy(values).reshape((1, -1))) > 0

    def rows(self, layer, probe, positions, values):
        """Store rows of one probe for several positions at once: values[i] is the row of positions[i] (a [n, ...]
        array). Positions the dump does not store are skipped. Returns the number of rows stored."""
        layer, p, shape = self._probe(layer, probe, per_entry=False)
        if self.keep is not None and probe not in self.keep:
            return 0
        positions = [int(x) for x in to_numpy(positions).reshape(-1)]
        values = to_numpy(values)
        if values.shape[:1] != (len(positions),):
            raise DumpError(f"{self.path}: {schema.dataset_name(layer, probe)}: {len(positions)} positions but "
                            f"values of shape {list(values.shape)} (the first dimension is one row per position)")
        dname = schema.dataset_name(layer, probe)
        if dname not in self.written:
            self._dataset(dname, p.dtype, (len(self.positions),) + shape, per_entry=False)
            self.written[dname] = np.zeros(len(self.positions), bool)
        done = self.written[dname]
        ds = self.f[dname]
        for q in positions:
            if not 0 <= q < self.T:
                raise DumpError(f"{self.path}: {dname}: position {q} out of [0, {self.T})")
        picked = [(self.row_of[q], i) for i, q in enumerate(positions) if q in self.row_of]
        if not picked:
            return 0
        fitted = {r: self._fit(dname, p, layer, shape, self.positions[r], values[i]) for r, i in picked}
        rs = sorted(fitted)
        start = 0
        for k in range(1, len(rs) + 1):  # one write per run of consecutive rows
            if k == len(rs) or rs[k] != rs[k - 1] + 1:
                run = rs[start:k]
                ds[run[0]:run[-1] + 1] = np.stack([fitted[r] for r in run])
                start = k
        done[rs] = True
        return len(rs)

    def entries(self, layer, probe, values):
        """Store a per-entry probe (compressed_kv, indexer_kv) whole: values [n_entries, row], entry w at row w,
        n_entries <= T div ratio. Written once per dataset."""
        layer, p, shape = self._probe(layer, probe, per_entry=True)
        if self.keep is not None and probe not in self.keep:
            return False
        dname = schema.dataset_name(layer, probe)
        if dname in self.written:
            raise DumpError(f"{self.path}: dataset {dname} is already written")
        v = to_numpy(values).astype(np.float32)
        if v.ndim == 1 and v.size == 0:
            v = v.reshape((0,) + shape)
        max_n = self.T // self.cfg.ratio[layer]
        if v.ndim != 2 or v.shape[1:] != shape or v.shape[0] > max_n:
            raise DumpError(f"{self.path}: {dname}: shape {list(v.shape)}, expected [n <= {max_n}, {shape[0]}] "
                            f"({self.T} tokens, compress ratio {self.cfg.ratio[layer]})")
        ds = self._dataset(dname, "f32", v.shape, per_entry=True)
        if v.size:
            ds[...] = v
        self.written[dname] = None
        return True

    def set_tokens(self, tokens):
        """Replace /tokens (a greedy run learns its tokens as it goes); the count cannot change."""
        tokens = [int(t) for t in to_numpy(tokens).reshape(-1)]
        if len(tokens) != self.T:
            raise DumpError(f"{self.path}: /tokens holds {self.T} tokens, got {len(tokens)}")
        self._check_ids(tokens, "/tokens")
        self.f["tokens"][...] = np.asarray(tokens, dtype="<i4")

    def attr(self, name, value):
        """Set an extra root string attribute (not one the writer sets itself)."""
        if name in RESERVED_ATTRS:
            raise DumpError(f"{self.path}: attribute {name!r} is set by the writer itself")
        self.f.attrs[name] = str(value)

    # -- end
    def missing_rows(self):
        """{dataset: [positions without a row]} for the per-position datasets written so far."""
        out = {}
        for name, done in self.written.items():
            if done is not None and not done.all():
                out[name] = [self.positions[i] for i in np.flatnonzero(~done)]
        return out

    def commit(self):
        """Check every started dataset is complete, close, and rename into place. The writer is finished after
        this, whether it succeeds or raises (then the temporary is removed)."""
        if self.f is None:
            raise DumpError(f"{self.path}: the writer is already finished")
        miss = self.missing_rows()
        if miss:
            lines = [f"{n} ({len(p)} of {len(self.positions)} positions, e.g. {p[:5]})" for n, p in
                     sorted(miss.items())[:8]]
            self.abort()
            raise DumpError(f"{self.path}: rows never written (a probe is either absent or has every stored "
                            f"position): " + "; ".join(lines) + (" ..." if len(miss) > 8 else ""))
        try:
            self.f.close()
            self.f = None
            os.replace(self.tmp_path, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self):
        """Close and remove the temporary file; the final name is never touched. Safe to call twice."""
        if self.f is not None:
            try:
                self.f.close()
            except Exception:
                pass
            self.f = None
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False
