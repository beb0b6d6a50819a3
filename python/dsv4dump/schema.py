"""schema.py - what a dsv4-dump/1 file holds: the probe table and each probe's row shape from config_json.

The table mirrors dump/probe_defs.c (the C writer, reader and verifier use that one): 18 layer probes (two of
them per entry) and 3 final ones, in model order, each with its dtype, its row dimensions in config terms and the
attention types of the layers it exists on. The config reading mirrors the part of model/config.c that the
shapes depend on, with transformers' precedence and defaults (layer_types > compress_ratios > the V4-Pro default
schedule; mlp_layer_types > num_hash_layers).

Quiet traps this module keeps in one place:
- indexer_scores rows are N = (last stored position + 1) div compress_ratio wide: the width depends on the
  positions a file stores, not only on the config.
- attn_hc_comb is [hc_mult, hc_mult], out is [hc_mult, D]: a flattened row of the right size is a different shape.
- per-entry probes (compressed_kv, indexer_kv) have one row per compressed entry made over the whole run, at most
  T div ratio of them (T = prompt_len + n_decode), whatever positions are stored.

docs/dump-format.md is the reference for every name here.
"""
import json
from collections import namedtuple

SCHEMA = "dsv4-dump/1"

SLIDING, CSA, HCA = "sliding", "csa", "hca"
ATTN_TYPES = {"sliding_attention": SLIDING, "compressed_sparse_attention": CSA,
              "heavily_compressed_attention": HCA}
MLP_TYPES = ("hash_moe", "moe")

# name, final (under /final), per_entry (first dim = compressed entries), dtype, row dims, layer types it exists on
Probe = namedtuple("Probe", "name final per_entry dtype dims on")
_ALL = frozenset((SLIDING, CSA, HCA))
_COMPRESSED = frozenset((CSA, HCA))
_CSA = frozenset((CSA,))

PROBES = (
    Probe("attn_hc_pre", False, False, "f32", ("hc",), _ALL),
    Probe("attn_hc_post", False, False, "f32", ("hc",), _ALL),
    Probe("attn_hc_comb", False, False, "f32", ("hc", "hc"), _ALL),
    Probe("attn_in", False, False, "f32", ("D",), _ALL),
    Probe("kv", False, False, "f32", ("head_dim",), _ALL),
    Probe("compressed_kv", False, True, "f32", ("head_dim",), _COMPRESSED),
    Probe("indexer_kv", False, True, "f32", ("index_head_dim",), _CSA),
    Probe("indexer_scores", False, False, "f32", ("n_entries",), _CSA),
    Probe("topk_idx", False, False, "i32", ("index_topk",), _CSA),
    Probe("attn_out", False, False, "f32", ("D",), _ALL),
    Probe("ffn_hc_pre", False, False, "f32", ("hc",), _ALL),
    Probe("ffn_hc_post", False, False, "f32", ("hc",), _ALL),
    Probe("ffn_hc_comb", False, False, "f32", ("hc", "hc"), _ALL),
    Probe("ffn_in", False, False, "f32", ("D",), _ALL),
    Probe("router_ids", False, False, "i32", ("k_experts",), _ALL),
    Probe("router_weights", False, False, "f32", ("k_experts",), _ALL),
    Probe("ffn_out", False, False, "f32", ("D",), _ALL),
    Probe("out", False, False, "f32", ("hc", "D"), _ALL),
    Probe("hc_head", True, False, "f32", ("D",), _ALL),
    Probe("norm", True, False, "f32", ("D",), _ALL),
    Probe("logits", True, False, "f32", ("vocab",), _ALL),
)
assert len(PROBES) == 21, "the probe table is dump/probe_defs.c's: 18 layer probes and 3 final ones"
LAYER_PROBES = {p.name: p for p in PROBES if not p.final}
FINAL_PROBES = {p.name: p for p in PROBES if p.final}

# What every dump must hold (docs/dump-format.md "Partial dumps"): the residual streams after each layer and the
# logits. Every engine can give them, and with them the verifier still finds the first diverging layer; any other
# probe a producer may omit, by not writing its dataset.
REQUIRED_LAYER_PROBES = ("out",)
REQUIRED_FINAL_PROBES = ("logits",)


class ConfigError(ValueError):
    """config_json cannot give the shapes: the message names the key."""


def _get(root, key, default=None, required=False, kind=int):
    v = root.get(key)
    if v is None:
        if required:
            raise ConfigError(f'missing required key "{key}"')
        return default
    if kind is int:
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v == int(v))):
            raise ConfigError(f'key "{key}" must be an integer, got {v!r}')
        return int(v)
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f'key "{key}" must be a number, got {v!r}')
        return float(v)
    if kind is bool:
        if not isinstance(v, bool):
            raise ConfigError(f'key "{key}" must be true or false, got {v!r}')
        return v
    return v


class Config:
    """The config values a dump's shapes and value rules depend on, parsed from config.json text.

    Fields: num_layers, attention[L] ('sliding'|'csa'|'hca'), mlp[L] ('hash_moe'|'moe'), ratio[L] (0 for sliding),
    hc_mult, hidden_size, head_dim, index_head_dim, index_topk, num_experts_per_tok, n_routed_experts,
    vocab_size, routed_scaling_factor, norm_topk_prob, hc_eps, and `raw` (the parsed JSON object)."""

    def __init__(self, text):
        try:
            root = json.loads(text)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"not JSON: {e}") from None
        if not isinstance(root, dict):
            raise ConfigError("not a JSON object")
        self.raw = root
        self.vocab_size = _get(root, "vocab_size", required=True)
        self.hidden_size = _get(root, "hidden_size", required=True)
        self.num_layers = _get(root, "num_hidden_layers", required=True)
        self.head_dim = _get(root, "head_dim", required=True)
        _get(root, "num_attention_heads", required=True)
        self.index_head_dim = _get(root, "index_head_dim", 128)
        self.index_topk = _get(root, "index_topk", 512)
        experts_key = "n_routed_experts" if "n_routed_experts" in root or "num_local_experts" not in root \
            else "num_local_experts"
        self.n_routed_experts = _get(root, experts_key, 256)
        self.num_experts_per_tok = _get(root, "num_experts_per_tok", 6)
        self.hc_mult = _get(root, "hc_mult", 4)
        self.routed_scaling_factor = _get(root, "routed_scaling_factor", 1.5, kind=float)
        self.norm_topk_prob = _get(root, "norm_topk_prob", True, kind=bool)
        self.hc_eps = _get(root, "hc_eps", 1e-6, kind=float)
        for key in ("vocab_size", "hidden_size", "num_layers", "head_dim", "index_head_dim", "index_topk",
                    "n_routed_experts", "num_experts_per_tok", "hc_mult"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} = {getattr(self, key)} must be at least 1")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ConfigError(f"num_experts_per_tok {self.num_experts_per_tok} > n_routed_experts "
                              f"{self.n_routed_experts}")
        self._schedule(root)

    def _schedule(self, root):
        n = self.num_layers
        csa, hca = 4, 128
        rates = root.get("compress_rates")
        if rates is not None:
            if not isinstance(rates, dict):
                raise ConfigError('key "compress_rates" must be an object')
            csa = _get(rates, "compressed_sparse_attention", 4)
            hca = _get(rates, "heavily_compressed_attention", 128)
        csa = _get(root, "compress_rate_csa", csa)
        hca = _get(root, "compress_rate_hca", hca)
        if csa < 1 or hca < 1:
            raise ConfigError(f"compress rates {csa} / {hca} must be at least 1")
        lt, cr = root.get("layer_types"), root.get("compress_ratios")
        if lt is not None:
            if not isinstance(lt, list) or len(lt) != n:
                raise ConfigError(f'key "layer_types" must list {n} layer types (num_hidden_layers)')
            bad = [i for i, t in enumerate(lt) if t not in ATTN_TYPES]
            if bad:
                raise ConfigError(f'key "layer_types"[{bad[0]}] = {lt[bad[0]]!r} must be sliding_attention, '
                                  f'compressed_sparse_attention or heavily_compressed_attention')
            self.attention = [ATTN_TYPES[t] for t in lt]
        elif cr is not None:
            if not isinstance(cr, list) or len(cr) < n:
                raise ConfigError(f'key "compress_ratios" must hold at least {n} entries (num_hidden_layers)')
            bad = [i for i in range(n) if cr[i] not in (0, 4, 128) or isinstance(cr[i], bool)]
            if bad:
                raise ConfigError(f'key "compress_ratios"[{bad[0]}] = {cr[bad[0]]!r} must be 0, 4 or 128')
            self.attention = [{0: SLIDING, 4: CSA, 128: HCA}[cr[i]] for i in range(n)]
        else:  # transformers' default: the V4-Pro schedule
            self.attention = [HCA if i < 2 or (i - 2) % 2 == 0 else CSA for i in range(n)]
        self.ratio = [{SLIDING: 0, CSA: csa, HCA: hca}[t] for t in self.attention]
        mt = root.get("mlp_layer_types")
        if mt is not None:
            if not isinstance(mt, list) or len(mt) != n or any(t not in MLP_TYPES for t in mt):
                raise ConfigError(f'key "mlp_layer_types" must list {n} of hash_moe / moe')
            self.mlp = list(mt)
        else:
            nh = _get(root, "num_hash_layers", 3)
            if nh < 0:
                raise ConfigError('key "num_hash_layers" is negative')
            self.mlp = ["hash_moe" if i < nh else "moe" for i in range(n)]

    def dim(self, key, layer, last_pos):
        """One row dimension (a Probe.dims key) on `layer`, for a file whose last stored position is last_pos."""
        if key == "n_entries":
            return (last_pos + 1) // self.ratio[layer] if last_pos >= 0 else 0
        return {"hc": self.hc_mult, "D": self.hidden_size, "head_dim": self.head_dim,
                "index_head_dim": self.index_head_dim, "index_topk": self.index_topk,
                "k_experts": self.num_experts_per_tok, "vocab": self.vocab_size}[key]


def find_probe(layer, name):
    """The Probe called `name` under /layers (layer >= 0) or /final (layer None or -1), or None."""
    return (FINAL_PROBES if layer is None or layer < 0 else LAYER_PROBES).get(name)


def row_shape(probe, cfg, layer, last_pos):
    """The row shape of `probe` (a Probe) on `layer` (ignored for final probes). Raises ValueError when the probe
    does not exist on that layer's attention type (indexer_scores on a sliding layer, say)."""
    if not probe.final:
        if not 0 <= layer < cfg.num_layers:
            raise ValueError(f"probe {probe.name}: layer {layer} out of range [0, {cfg.num_layers})")
        if cfg.attention[layer] not in probe.on:
            raise ValueError(f"probe {probe.name} does not exist on layer {layer} (attention {cfg.attention[layer]})")
    return tuple(cfg.dim(d, layer, last_pos) for d in probe.dims)


def dataset_name(layer, name):
    """"layers/<L>/<name>" or "final/<name>" (layer None or -1)."""
    return f"final/{name}" if layer is None or layer < 0 else f"layers/{layer}/{name}"


def split_dataset_name(path):
    """"layers/3/attn_out" -> (3, "attn_out"); "final/logits" -> (-1, "logits"); anything else -> None."""
    parts = path.strip("/").split("/")
    if len(parts) == 2 and parts[0] == "final":
        return -1, parts[1]
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and str(int(parts[1])) == parts[1]:
        return int(parts[1]), parts[2]
    return None


def expected_probes(cfg):
    """Every dataset name a complete dump of this config holds, in model order."""
    out = []
    for layer in range(cfg.num_layers):
        out += [dataset_name(layer, p.name) for p in PROBES if not p.final and cfg.attention[layer] in p.on]
    return out + [dataset_name(-1, p.name) for p in PROBES if p.final]
