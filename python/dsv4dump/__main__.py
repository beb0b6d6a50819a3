"""python3 -m dsv4dump COMMAND: check dumps, compute a weights digest, turn a prompt into token ids.

  check FILE... [--complete] [--quiet]   validate dsv4-dump/1 files against the schema and their config_json;
                                          one line per problem; exit 0 fine, 1 problems, 2 a file unreadable
  digest MODEL_DIR                        print the weights_digest a dump of that model carries
  tokens --tokenizer DIR [--out FILE] [--bos] TEXT
                                          token ids of TEXT for `dsv4 run --prompt-tokens FILE` (needs the
                                          `tokenizers` package; exit 2 without it)
The format is docs/dump-format.md of the dsv4 repository.
"""
import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m dsv4dump", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("check", help="validate dumps against the schema and their config")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--complete", action="store_true",
                   help="every probe of the schema must be present (what dsv4's own paths and the golden write)")
    c.add_argument("--quiet", action="store_true", help="print only the problems")
    d = sub.add_parser("digest", help="the weights_digest of a model folder")
    d.add_argument("model_dir")
    t = sub.add_parser("tokens", help="prompt text -> a --prompt-tokens file")
    t.add_argument("--tokenizer", required=True, metavar="DIR", help="folder with tokenizer.json (or the file)")
    t.add_argument("--out", metavar="FILE", help="write the ids here (default: standard output)")
    t.add_argument("--bos", action="store_true", help="start with the BOS token (bos_token_id of the folder)")
    t.add_argument("--no-special-tokens", action="store_true",
                   help="no special tokens from the tokenizer's post-processor")
    t.add_argument("text")
    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.print_help(sys.stderr)
        return 2
    if args.cmd == "check":
        try:
            from .check import main_check
        except ImportError as e:
            print(f"dsv4dump check: needs numpy and h5py ({e}); on Debian: apt-get install python3-numpy "
                  f"python3-h5py", file=sys.stderr)
            return 2
        return main_check(args.files, complete=args.complete, quiet=args.quiet)
    if args.cmd == "digest":
        from .digest import weights_digest
        try:
            print(weights_digest(args.model_dir))
        except OSError as e:
            print(f"dsv4dump digest: {e}", file=sys.stderr)
            return 2
        return 0
    from .tokens import TokenizerMissing, encode, write_prompt_tokens
    try:
        ids = encode(args.tokenizer, args.text, bos=args.bos, special_tokens=not args.no_special_tokens)
    except TokenizerMissing as e:
        print(f"dsv4dump tokens: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"dsv4dump tokens: {e}", file=sys.stderr)
        return 2
    if args.out:
        write_prompt_tokens(args.out, ids)
        print(f"dsv4dump tokens: {len(ids)} tokens -> {args.out}", file=sys.stderr)
    else:
        print(" ".join(str(i) for i in ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
