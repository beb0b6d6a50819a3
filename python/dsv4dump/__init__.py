"""dsv4dump - write and check dsv4-dump/1 files (HDF5), the layer-by-layer probe dumps that `dsv4 verify` compares.

    from dsv4dump import DumpWriter, weights_digest, check_file

DumpWriter writes a dump laid out as dsv4's own C writer does (rows by layer, probe and position; per-entry pools;
the root attributes; a temporary name renamed on success). check_file / `python3 -m dsv4dump check FILE` validates a
file against the schema and its own config. `dsv4dump.transformers.capture(model)` hooks transformers'
DeepseekV4ForCausalLM (needs torch). The format: docs/dump-format.md of the dsv4 repository; engines:
docs/external-engines.md. numpy + h5py only (torch for the transformers adapter, tokenizers for the tokens command).
The names below are imported on first use, so `python3 -m dsv4dump tokens` runs where numpy is missing.
"""
__version__ = "0.1.0"

_LAZY = {"DumpWriter": "writer", "DumpError": "writer", "weights_digest": "digest", "Config": "schema",
         "ConfigError": "schema", "PROBES": "schema", "SCHEMA": "schema", "check_file": "check"}
__all__ = sorted(_LAZY)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'dsv4dump' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
