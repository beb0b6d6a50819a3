"""transformers.py - the transformers adapter: forward hooks that reach every probe of DeepseekV4ForCausalLM.

    from dsv4dump.transformers import capture, run_sequence
    cap = capture(model)                                   # registers the hooks (model in eval, fp32 for a golden)
    tokens, logits, cache = run_sequence(model, cap, prompt, forced, n_decode, "forced", store=positions)
    with DumpWriter(path, model_dir=..., producer=..., tokens=tokens, prompt_len=len(prompt),
                    positions=positions) as w:
        cap.write(w)                                       # every probe at every stored position
    cap.remove()

or, in one call, dump(model, path, model_dir=..., prompt=..., n_decode=...). golden/make_golden.py makes the committed
golden sets with exactly this code (it was its Recorder), so the adapter is checked against them bit for bit on the
device machine (golden/adapter_check_on_device.sh).

Where each probe comes from (transformers 5.17, modeling_deepseek_v4; docs/external-engines.md has the table):
  attn_hc_* / ffn_hc_*, attn_in / ffn_in   the attn_hc / ffn_hc outputs (post, comb, collapsed); transformers does not
                                           return `pre`: it is recomputed from the hook's input with the module's own
                                           operations and checked to reproduce the module's collapse
  kv                                       self_attn.kv_norm output, rotated with transformers' own
                                           apply_rotary_pos_emb and the cos/sin the layer got (a pre-hook on self_attn)
  attn_out, ffn_out, out                   self_attn output 0, mlp output, the decoder layer's output
  compressed_kv, indexer_kv                the compressor's output pool and the pool handed to the indexer's scorer,
                                           as they stand after the last forward (T div ratio rows)
  indexer_scores                           the scorer's output, -inf at the entries not visible to the row's position
  topk_idx                                 the indexer's output (raw entry ids, -1 for invalid prefill picks)
  router_ids / router_weights              the gate's output (weights already normalised and scaled)
  final/hc_head, final/norm, final/logits  model.model.hc_head, model.model.norm, the model output
Quiet traps kept here: rows are keyed by the absolute positions given to begin_forward (the position_ids the
attention receives are checked against them); a hook that does not fire exactly once per forward fails the forward
(a transformers version whose module tree moved would otherwise give stale rows); tensors are copied inside the hook.
Needs torch and transformers >= 5.8 (DeepSeek-V4); imported when a Capture is made, so `import dsv4dump` never needs
them.
"""
from collections import Counter, defaultdict

import numpy as np

CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
SLIDING = "sliding_attention"

# model order of the per-position layer probes (docs/dump-format.md)
PER_POSITION = ("attn_hc_pre", "attn_hc_post", "attn_hc_comb", "attn_in", "kv", "indexer_scores", "topk_idx",
                "attn_out", "ffn_hc_pre", "ffn_hc_post", "ffn_hc_comb", "ffn_in", "router_ids", "router_weights",
                "ffn_out", "out")
FINAL = ("hc_head", "norm", "logits")

torch = F = mdv4 = DynamicCache = None  # set by _import_torch()


class CaptureError(RuntimeError):
    """A hook that saw something it cannot turn into a probe row (the message says what)."""


def need(cond, msg):
    if not cond:
        raise CaptureError(msg)


def _log(msg=""):
    print(msg, flush=True)


def _import_torch():
    global torch, F, mdv4, DynamicCache
    if mdv4 is not None:
        return
    import torch as _torch
    import torch.nn.functional as _F
    from transformers import DynamicCache as _DynamicCache
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as _mdv4
    need(hasattr(_mdv4, "apply_rotary_pos_emb"), "modeling_deepseek_v4.apply_rotary_pos_emb is gone")
    torch, F, mdv4, DynamicCache = _torch, _F, _mdv4, _DynamicCache


class Capture:
    """Forward hooks on every probe's module of a DeepseekV4ForCausalLM; rows kept per absolute position.

    mode: "off" (hooks do nothing), "record" (rows of the positions in `store` are kept: rows[dataset][position],
    entries[dataset] = the pool after the last forward; every hook must fire exactly once per forward, checked by
    end_forward), "nocache" (a forward without a cache whose top-k picks go to nocache_topk[layer], for comparing the
    cached run with transformers' own no-cache forward). begin_forward(positions) names the absolute positions of the
    forward's rows (the hooks see batch 1, S rows); put_logits(logits) stores the model output's logits.
    """

    def __init__(self, model, log=None):
        _import_torch()
        self.log = log or _log
        self.model = model
        self.cfg = model.config
        self.mode = "off"
        self.positions = []
        self.store = set()
        self.rows = defaultdict(dict)
        self.entries = {}
        self.fired = Counter()
        self.rope = {}
        self.nocache_topk = {}
        self.handles = []
        self.expected = Counter()
        self.ratio = self.cfg.compress_rates
        self.hooked = []
        self._register()

    # -- registration
    def _hook(self, module, key, fn, pre=False):
        def wrapped(*a):
            if self.mode == "off":
                return None
            if self.mode == "record":
                self.fired[key] += 1
            fn(module, *a)
            return None
        if pre:
            h = module.register_forward_pre_hook(lambda m, args, kwargs: wrapped(args, kwargs), with_kwargs=True)
        else:
            h = module.register_forward_hook(lambda m, args, kwargs, out: wrapped(args, kwargs, out),
                                             with_kwargs=True)
        self.handles.append(h)
        self.expected[key] += 1

    def _register(self):
        mm = self.model.model
        expect_cls = {SLIDING: None, CSA: "DeepseekV4CSACompressor", HCA: "DeepseekV4HCACompressor"}
        for L, layer in enumerate(mm.layers):
            lt = self.cfg.layer_types[L]
            att = layer.self_attn
            comp = getattr(att, "compressor", None)
            got = None if comp is None else type(comp).__name__
            need(got == expect_cls[lt], f"layer {L} ({lt}): compressor {got}, expected {expect_cls[lt]}")
            names = [("layer", type(layer).__name__), ("attn_hc", type(layer.attn_hc).__name__),
                     ("ffn_hc", type(layer.ffn_hc).__name__), ("self_attn", type(att).__name__),
                     ("self_attn.kv_norm", type(att.kv_norm).__name__), ("mlp", type(layer.mlp).__name__),
                     ("mlp.gate", type(layer.mlp.gate).__name__)]
            self._hook(layer, (L, "layer"), self._on_layer)
            self._hook(layer.attn_hc, (L, "attn_hc"), lambda m, a, k, o, L=L: self._on_hc(L, "attn", m, a, k, o))
            self._hook(layer.ffn_hc, (L, "ffn_hc"), lambda m, a, k, o, L=L: self._on_hc(L, "ffn", m, a, k, o))
            self._hook(att, (L, "attn_pre"), lambda m, a, k, L=L: self._on_attn_pre(L, m, a, k), pre=True)
            self._hook(att, (L, "attn"), lambda m, a, k, o, L=L: self._put(f"layers/{L}/attn_out", o[0]))
            self._hook(att.kv_norm, (L, "kv"), lambda m, a, k, o, L=L: self._on_kv(L, o))
            self._hook(layer.mlp, (L, "mlp"), lambda m, a, k, o, L=L: self._put(f"layers/{L}/ffn_out", o))
            self._hook(layer.mlp.gate, (L, "gate"), lambda m, a, k, o, L=L: self._on_gate(L, o))
            if comp is not None:
                self._hook(comp, (L, "compressor"), lambda m, a, k, o, L=L: self._on_compressor(L, o))
                names.append(("self_attn.compressor", type(comp).__name__))
            if lt == CSA:
                idx = comp.indexer
                self._hook(idx, (L, "indexer"), lambda m, a, k, o, L=L: self._on_indexer(L, o))
                self._hook(idx.scorer, (L, "scorer"), lambda m, a, k, o, L=L: self._on_scorer(L, a, k, o))
                names += [("self_attn.compressor.indexer", type(idx).__name__),
                          ("self_attn.compressor.indexer.scorer", type(idx.scorer).__name__)]
            self.hooked.append((L, lt, self.cfg.mlp_layer_types[L], names))
        self._hook(mm.hc_head, (-1, "hc_head"), lambda m, a, k, o: self._put("final/hc_head", o))
        self._hook(mm.norm, (-1, "norm"), lambda m, a, k, o: self._put("final/norm", o))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def describe(self):
        """Log the hooked module classes of every layer (what the hooks were registered on)."""
        for L, lt, mt, names in self.hooked:
            self.log(f"hooks layer {L} ({lt}, {mt}): " + ", ".join(f"{n}={c}" for n, c in names))
        self.log("hooks final: model.model.hc_head, model.model.norm; logits from the model output")

    # -- per-forward bookkeeping
    def begin_forward(self, positions):
        self.positions = [int(p) for p in positions]
        self.fired = Counter()

    def end_forward(self):
        if self.mode != "record":
            return
        missing = [k for k, n in self.expected.items() if self.fired[k] != n]
        need(not missing, "hooks that did not fire exactly once in this forward: "
             + ", ".join(f"{k}:{self.fired[k]}" for k in sorted(missing, key=str)))

    # -- hook bodies
    def _rows_of(self, t):
        t = t.detach()
        need(t.shape[0] == 1, f"batch of {t.shape[0]}")
        t = t[0]
        need(t.shape[0] == len(self.positions), f"{t.shape[0]} rows for {len(self.positions)} positions")
        return t

    def _put(self, name, t):
        if self.mode != "record":
            return
        if isinstance(t, tuple):
            t = t[0]
        t = self._rows_of(t)
        for i, p in enumerate(self.positions):
            if p in self.store:
                self.rows[name][p] = t[i].float().cpu().numpy().copy() if t.is_floating_point() else \
                    t[i].cpu().numpy().astype(np.int32)

    def _on_layer(self, m, a, k, o):
        self._put(f"layers/{m.layer_idx}/out", o)

    def _on_hc(self, L, which, m, args, kwargs, out):
        if self.mode != "record":
            return
        hs = args[0] if args else kwargs["hidden_streams"]
        if len(out) == 4:  # a transformers that returns pre as well
            pre, post, comb, collapsed = out
            self._put(f"layers/{L}/{which}_hc_pre", pre)
            self._put(f"layers/{L}/{which}_hc_post", post)
            self._put(f"layers/{L}/{which}_hc_comb", comb)
            self._put(f"layers/{L}/{which}_in", collapsed)
            return
        post, comb, collapsed = out
        # pre is consumed inside the module: recompute it with the module's own operations.
        B, S = hs.shape[:2]
        hc = m.hc_mult
        flat = m.input_norm(hs.reshape(B, S, -1).float())
        mix = F.linear(flat, m.fn.float())
        pre = torch.sigmoid(mix[..., :hc] * m.scale[0] + m.base[:hc]) + m.hc_eps
        again = (pre.unsqueeze(-1) * hs).sum(dim=2).to(hs.dtype)
        if not torch.equal(again, collapsed):
            d = float((again - collapsed).abs().max())
            # fp32 (the golden): within 1e-6; a bf16/f16 model: within two units of its rounding
            tol = 1e-6 if collapsed.dtype == torch.float32 else 2 * torch.finfo(collapsed.dtype).eps
            need(d <= tol * max(1.0, float(collapsed.abs().max())),
                 f"layer {L} {which}_hc: recomputed pre does not reproduce the collapse (max diff {d:.3g})")
            self.log(f"note: layer {L} {which}_hc recomputed collapse differs by {d:.3g} (not bitwise)")
        self._put(f"layers/{L}/{which}_hc_pre", pre)
        self._put(f"layers/{L}/{which}_hc_post", post)
        self._put(f"layers/{L}/{which}_hc_comb", comb)
        self._put(f"layers/{L}/{which}_in", collapsed)

    def _on_attn_pre(self, L, m, args, kwargs):
        if self.mode != "record":
            return
        pe = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)
        need(pe is not None, f"layer {L}: self_attn got no position_embeddings")
        kind = getattr(m, "rope_layer_type", "main" if self.cfg.layer_types[L] == SLIDING else "compress")
        self.rope[L] = pe[kind] if isinstance(pe, dict) else pe
        pid = kwargs.get("position_ids", args[2] if len(args) > 2 else None)
        need(pid is not None, f"layer {L}: self_attn got no position_ids")
        got = [int(x) for x in pid.reshape(-1)]
        need(got == self.positions, f"layer {L}: position_ids {got[:4]}.. but expected {self.positions[:4]}..")

    def _on_kv(self, L, out):
        if self.mode != "record":
            return
        cos, sin = self.rope[L]
        B, S, d = out.shape
        kv = out.view(B, S, -1, d).transpose(1, 2)  # as DeepseekV4Attention.forward
        kv = mdv4.apply_rotary_pos_emb(kv, cos, sin)  # [B, 1, S, d]
        self._put(f"layers/{L}/kv", kv[:, 0])

    def _on_gate(self, L, out):
        if self.mode != "record":
            return
        _, weights, ids = out
        S = len(self.positions)
        self._put(f"layers/{L}/router_weights", weights.reshape(1, S, -1))
        self._put(f"layers/{L}/router_ids", ids.reshape(1, S, -1))

    def _on_compressor(self, L, out):
        if self.mode != "record":
            return
        kv = out[0]  # [B, 1, T, head_dim]: every entry so far (the cache's running pool)
        self.entries[f"layers/{L}/compressed_kv"] = kv[0, 0].detach().float().cpu().numpy().copy()

    def _on_indexer(self, L, out):
        if self.mode == "nocache":
            self.nocache_topk[L] = out[0].detach().cpu().numpy().astype(np.int64)
            return
        self._put(f"layers/{L}/topk_idx", out)

    def _on_scorer(self, L, args, kwargs, out):
        if self.mode != "record":
            return
        ckv = args[1] if len(args) > 1 else kwargs["compressed_kv"]
        self.entries[f"layers/{L}/indexer_kv"] = ckv[0].detach().float().cpu().numpy().copy()
        r = self.ratio[CSA]
        t = self._rows_of(out)
        for i, p in enumerate(self.positions):
            if p in self.store:
                row = t[i].float().cpu().numpy().copy()
                row[(p + 1) // r:] = -np.inf  # not visible to p: w >= (p+1) div 4
                self.rows[f"layers/{L}/indexer_scores"][p] = row

    def write(self, w, complete=True):
        """Every recorded row at the writer's stored positions, and the pools, into DumpWriter w (the transformers names
        of the layer types mapped to the schema's). complete: every probe of the schema must have a row at every stored
        position (CaptureError naming the first that does not); False writes what was recorded (a partial dump)."""
        cfg = self.cfg
        positions = list(w.positions)

        def rows_of(name, layer, probe):
            rows = self.rows.get(name, {})
            miss = [p for p in positions if p not in rows]
            if miss and not complete and len(miss) == len(positions):
                return
            need(not miss, f"{w.path}: {name} has no row for positions {miss[:5]}")
            w.rows(layer, probe, positions, np.stack([rows[p] for p in positions]) if positions else
                   np.zeros((0, 0)))

        for L, lt in enumerate(cfg.layer_types):
            for probe in PER_POSITION:
                if probe in ("indexer_scores", "topk_idx") and lt != CSA:
                    continue
                if probe in ("indexer_scores", "topk_idx"):
                    # ragged: rows of different lengths (pool sizes, picks) are padded by the writer one at a time
                    name = f"layers/{L}/{probe}"
                    rows = self.rows.get(name, {})
                    miss = [p for p in positions if p not in rows]
                    if miss and not complete and len(miss) == len(positions):
                        continue
                    need(not miss, f"{w.path}: {name} has no row for positions {miss[:5]}")
                    for p in positions:
                        w.row(L, probe, p, rows[p])
                    continue
                rows_of(f"layers/{L}/{probe}", L, probe)
            for probe in ("compressed_kv", "indexer_kv"):
                if probe == "indexer_kv" and lt != CSA or probe == "compressed_kv" and lt == SLIDING:
                    continue
                name = f"layers/{L}/{probe}"
                if name not in self.entries and not complete:
                    continue
                need(name in self.entries, f"{w.path}: no {name}")
                w.entries(L, probe, self.entries[name])
        for probe in FINAL:
            rows_of(f"final/{probe}", None, probe)

    def put_logits(self, logits):
        """Store the rows of the model output's logits [1, S, V] for the current forward's positions."""
        self._put("final/logits", logits)


def run_sequence(model, rec, prompt, forced, n_decode, mode, store, log=None):
    """Prefill `prompt` (one forward with a DynamicCache), then n_decode one-token steps: forced (the tokens
    forced[P:]) or greedy (each step feeds the argmax of the previous logits). The Capture `rec` records the rows of the
    positions in `store`. Returns the tokens fed (all T), the logits [T, V] (fp32) and the cache."""
    _import_torch()
    log = log or rec.log
    dev = next(model.parameters()).device  # the inputs go where the model is (the golden: the CPU)
    P = len(prompt)
    try:
        cache = DynamicCache(config=model.config)
    except TypeError as e:
        log(f"  note: DynamicCache(config=...) failed ({e}); letting the model make its cache")
        cache = None
    rec.rows = defaultdict(dict)
    rec.entries = {}
    rec.store = set(store)
    rec.mode = "record"
    tokens = list(prompt)
    logits = []
    with torch.no_grad():
        rec.begin_forward(range(P))
        out = model(input_ids=torch.tensor([prompt], dtype=torch.long, device=dev), past_key_values=cache,
                    use_cache=True)
        rec.end_forward()
        if cache is None:
            cache = out.past_key_values
        need(out.logits.shape[1] == P, f"prefill returned logits for {out.logits.shape[1]} positions")
        rec.put_logits(out.logits)
        logits.append(out.logits[0].float())
        log(f"  cache layers: {[type(l).__name__ for l in getattr(cache, 'layers', [])]}")
        for step in range(n_decode):
            p = P + step
            tok = int(torch.argmax(logits[-1][-1])) if mode == "greedy" else int(forced[p])
            if mode == "greedy":
                tokens.append(tok)
            seen = cache.get_seq_length()
            extra = {}
            if seen != p:  # transformers derives position_ids from this; give them explicitly instead
                log(f"  warning: cache.get_seq_length() = {seen} before position {p}; passing position_ids")
                extra["position_ids"] = torch.tensor([[p]], dtype=torch.long, device=dev)
            rec.begin_forward([p])
            out = model(input_ids=torch.tensor([[tok]], dtype=torch.long, device=dev), past_key_values=cache,
                        use_cache=True, **extra)
            rec.end_forward()
            rec.put_logits(out.logits)
            logits.append(out.logits[0].float())
    rec.mode = "off"
    if mode == "forced":
        tokens = list(forced)
    return tokens, torch.cat(logits, 0), cache


def capture(model, log=None):
    """Register the hooks on a DeepseekV4ForCausalLM (transformers >= 5.8) and return the Capture; its mode starts
    "off": run_sequence switches it to "record". Call .remove() to take the hooks off."""
    return Capture(model, log=log)


def dump(model, path, *, prompt, n_decode=0, forced=None, mode="forced", positions=None, model_dir=None,
         config_json=None, weights_digest=None, producer=None, attrs=None, log=None):
    """Run `prompt` (+ n_decode forced or greedy steps) through `model` with a cache and write a dsv4-dump/1 of the
    rows at `positions` (default every position) to `path`. forced: all T tokens (prompt first) for mode "forced".
    model_dir (or config_json + weights_digest) says which model folder the dump is of: dsv4 refuses to compare dumps
    of other weights, so give the folder the model was loaded from. Returns the tokens fed."""
    _import_torch()
    from .writer import DumpWriter
    prompt = [int(t) for t in prompt]
    P = len(prompt)
    need(mode in ("forced", "greedy"), f"mode {mode!r}")
    if mode == "forced":
        forced = [int(t) for t in (forced if forced is not None else prompt)]
        need(forced[:P] == prompt and len(forced) == P + n_decode,
             f"forced: {len(forced)} tokens starting with the prompt, expected {P} + {n_decode}")
    T = P + n_decode
    store = list(range(T)) if positions is None else sorted(int(p) for p in positions)
    cap = capture(model, log=log)
    try:
        model.eval()
        tokens, logits, _ = run_sequence(model, cap, prompt, forced, n_decode, mode, store, log=log)
        if producer is None:
            import transformers
            dt = next(model.parameters()).dtype
            dev = next(model.parameters()).device
            producer = f"transformers {transformers.__version__} {str(dt).replace('torch.', '')} {dev.type}"
        with DumpWriter(path, model_dir=model_dir, config_json=config_json, weights_digest=weights_digest,
                        producer=producer, tokens=tokens, prompt_len=P, mode=mode, positions=store,
                        attrs=attrs) as w:
            cap.write(w)
    finally:
        cap.remove()
    return tokens

