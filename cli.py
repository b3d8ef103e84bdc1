"""
Command lines for every script (train_rl.py, evaluate.py, bands.py, tiny.py): flags generated from a config
dataclass, defaults that depend on other flags (the tiny world's, an objective's), and one clean error line
for bad input.

    @dataclass
    class Config:
        steps: int = arg(50, "optimizer updates")       # -> --steps 50
    cfg = parse_config(Config, argv, "what the script does")
    if __name__ == "__main__":
        run_main(main, "script.py")
"""

import argparse
import sys
from dataclasses import field, fields


def arg(default, help, **kw):
    """A config field with its flag's help (and any other argparse keyword, e.g. choices or aliases)."""
    return field(default=default, metadata=dict(help=help, **kw))


def add_flags(parser, config_class):
    """One --flag per field of a config dataclass: the type from its annotation (a bool gives --flag and
    --no-flag), help and any other argparse keywords from its metadata (`aliases` adds option strings such
    as -k)."""
    for f in fields(config_class):
        meta = dict(f.metadata)
        names = ["--" + f.name.replace("_", "-"), *meta.pop("aliases", ())]
        if f.type is bool or bool in getattr(f.type, "__args__", ()):  # bool | None: None means "not given"
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=f.default, **meta)
            continue
        kind = next(t for t in (f.type, *getattr(f.type, "__args__", ())) if t in (int, float, str))
        parser.add_argument(*names, type=kind, default=f.default, **meta)
    return parser


def parse_config(config_class, argv, description, defaults=None, prog=None):
    """A config_class from argv. defaults(first) -> {field: value} gives defaults that depend on other flags
    (e.g. --model tiny brings the tiny world's budget): it sees a first parse, and flags given still win."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flags(parser, config_class)
    if defaults is not None:
        first, _ = parser.parse_known_args(argv)
        parser.set_defaults(**defaults(first))
    return config_class(**vars(parser.parse_args(argv)))


# The errors bad input raises (a malformed data row, a missing model, a bad flag value, a resume mismatch):
# they name the file and line, the flag or the model. Anything else is a bug and keeps its traceback.
EXPECTED_ERRORS = (ValueError, FileNotFoundError, FileExistsError)


def run_main(main, prog):
    """Run a command-line main: expected errors end the program with one `prog: error: ...` line (exit 2, as
    argparse's own errors), not a traceback."""
    try:
        return main()
    except EXPECTED_ERRORS as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
