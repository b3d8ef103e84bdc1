"""
Command lines for every script: flags generated from a config dataclass and shown in groups, defaults that
depend on other flags (the tiny world's, an objective's) shown as the ones in force, and one clean error line
for bad input.

    arg = arg_group("optimization")                  # the flags below show under "optimization" in --help
    @dataclass
    class Config:
        steps: int = arg(50, "optimizer updates")   # -> --steps 50
    cfg = parse_config(Config, argv, "what the script does")
    if __name__ == "__main__":
        run_main(main, "script.py")
"""

import argparse
import errno
import functools
import shutil
import signal
import sys
from dataclasses import field, fields

import torch


def arg(default, help, group=None, range=None, **kw):
    """A config field with its flag's help, its --help group, the interval its value must lie in (`range`, e.g.
    "[1, inf)", "(0, 1]"; checked by check_fields) and any other argparse keyword (e.g. choices)."""
    return field(default=default, metadata=dict(help=help, group=group, range=range, **kw))


def arg_group(name):
    """`arg` for the flags of one --help group."""
    return functools.partial(arg, group=name)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's default once, after its help (none where the default is "not given": None or '')."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=32, width=110)

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or action.default in (None, "", argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def add_flags(parser, config_class):
    """One --flag per field of a config dataclass, in argument groups by their `group` (in order of first use):
    the type from its annotation (a bool gives --flag and --no-flag), help and any other argparse keywords from
    its metadata (`aliases` adds option strings such as -k)."""
    groups = {name: parser.add_argument_group(name) for name in getattr(config_class, "HELP_GROUPS", ())}
    for f in fields(config_class):
        meta = dict(f.metadata)
        name = meta.pop("group", None) or "options"
        meta.pop("range", None)
        if name not in groups:
            groups[name] = parser.add_argument_group(name)
        names = ["--" + f.name.replace("_", "-"), *meta.pop("aliases", ())]
        if f.type is bool or bool in getattr(f.type, "__args__", ()):  # bool | None: None means "not given"
            groups[name].add_argument(*names, action=argparse.BooleanOptionalAction, default=f.default, **meta)
            continue
        kind = next(t for t in (f.type, *getattr(f.type, "__args__", ())) if t in (int, float, str))
        meta.setdefault("metavar", {int: "N", float: "X", str: "TEXT"}[kind] if "choices" not in meta else
                        "{" + ",".join(meta["choices"]) + "}")
        groups[name].add_argument(*names, type=kind, default=f.default, **meta)
    return parser


def parse_config(config_class, argv, description, defaults=None, prog=None, epilog=None):
    """A config_class from argv. defaults(first) -> {field: value} gives defaults that depend on other flags
    (e.g. --model tiny brings the tiny world's budget): it sees a first parse, flags given still win, and
    --help shows the defaults in force for the flags given with it."""
    def parser(with_help):
        return add_flags(argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                                 usage="%(prog)s [--flag VALUE ...] (--help lists them by group)",
                                                 formatter_class=HelpFormatter, add_help=with_help), config_class)
    final = parser(True)
    if defaults is not None:
        first, _ = parser(False).parse_known_args(argv)
        final.set_defaults(**defaults(first))
    cfg = config_class(**vars(final.parse_args(argv)))
    check_fields(cfg)
    return cfg


def in_range(value, spec):
    """Whether value lies in an interval written "[a, b]", "(a, b]", "[a, inf)", ..."""
    lo, hi = (float(x) for x in spec[1:-1].split(","))
    return (lo < value if spec[0] == "(" else lo <= value) and (value < hi if spec[-1] == ")" else value <= hi)


def range_words(spec):
    """ "at least 1", "> 0", ">= 0" or "in (0, 1]": what a range asks, for an error message."""
    if spec.endswith("inf)"):
        lo = spec[1:].split(",")[0]
        return (">= 0" if lo == "0" else f"at least {lo}") if spec[0] == "[" else f"> {lo}"
    return f"in {spec}"


def check_fields(cfg):
    """Every field with `choices` holds one of them and every field with a `range` lies in it, also when the config
    was built in Python (no argparse); the error names the flag. None means "not given" and passes."""
    for f in fields(cfg):
        value, choices, spec = getattr(cfg, f.name), f.metadata.get("choices"), f.metadata.get("range")
        if value is None:
            continue
        if choices is not None and value not in choices:
            raise ValueError(f"{flag(f.name)} must be one of {', '.join(map(str, choices))}, got {value!r}")
        if spec is not None and not in_range(value, spec):
            raise ValueError(f"{flag(f.name)} must be {range_words(spec)}, got {value}")
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            raise ValueError(f"{flag(f.name)} must fit in 64 bits (between -2**63 and 2**63 - 1), got {value}")


def flag(name):
    """The command-line spelling of a config field."""
    return "--" + name.replace("_", "-")


def world_epilog(tiny_defaults, ladder_defaults, more=""):
    """--help's last paragraph: the defaults the tiny world and its ladder bring (flag_defaults in each script)."""
    show = lambda d: ", ".join(f"{flag(k)} {v!r}" for k, v in d.items())  # noqa: E731
    return (f"--model tiny (or tiny-ladder, or a run trained from them) brings the tiny world's defaults: "
            f"{show(tiny_defaults)}. A tiny_ladder data set brings the ladder's: {show(ladder_defaults)}. Flags given "
            f"win; `--model tiny --help` shows the defaults in force. {more}").strip()


def check_device(device):
    """--device: '' (cuda when available), cpu, cuda or cuda:N, and cuda only with a CUDA build and a GPU."""
    kind, _, index = (device or "").partition(":")
    if kind not in ("", "cpu", "cuda") or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"--device {device!r}: use cpu, cuda or cuda:N (or leave it out: cuda when available)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA GPU; install a CUDA build "
                         f"of torch on a GPU machine, or use --device cpu")


# -----------------------------------------------------------------------------
# Errors: bad input (a malformed data row, a missing model, a bad flag value, a resume mismatch, a directory
# that cannot be written) ends a script with one line naming the file and line, the flag or the model. Anything
# else is a bug and keeps its traceback.

EXPECTED_ERRORS = (ValueError, FileNotFoundError, FileExistsError)
DISK_ERRORS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
               errno.EROFS: "read-only file system", errno.EISDIR: "is a directory",
               errno.ENOTDIR: "not a directory", errno.ENAMETOOLONG: "file name too long"}


def error_line(e):
    """The one line an expected error prints, or None for a bug."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) and e.args[0]:
        src, dst, why = e.args[0][0]  # copytree's list of (source, destination, reason); the first is enough
        return f"{dst}: {why}; free space, fix the permissions, or choose another --out"
    if isinstance(e, OSError) and e.errno in DISK_ERRORS:
        where = e.filename or "a file"
        return (f"{where}: {DISK_ERRORS[e.errno]}; free space, fix the permissions, or choose another --out "
                f"(checkpoints and final/ are written whole or not at all; a log line cut short is dropped on "
                f"--resume)")
    if isinstance(e, EXPECTED_ERRORS):
        return str(e)
    return None


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, `timeout`, `kill`): raised where Ctrl-C's KeyboardInterrupt is, so a script
    saves what it saves on Ctrl-C; run_main then exits with 143 (128 + 15, as a shell reports SIGTERM)."""
    signum = signal.SIGTERM


def raise_terminated(signum, frame):
    raise Terminated()


def run_main(main, prog):
    """Run a command-line main: expected errors end the program with one `prog: error: ...` line (exit 2, as
    argparse's own errors); Ctrl-C and SIGTERM run what the script saves on an interrupt, then exit with status
    130 (Ctrl-C) or 143 (SIGTERM), 128 + the signal's number as a shell reports it."""
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    interrupted = False
    try:
        return main()
    except KeyboardInterrupt as e:
        interrupted = True  # from here to the process's end (atexit included) another signal changes nothing
        for s in (signal.SIGINT, signal.SIGTERM):  # or it would end us by the signal, not with this status
            signal.signal(s, signal.SIG_IGN)
        if hasattr(e, "status"):  # a stop the run asked for (guards.Stop), after saving what Ctrl-C saves
            print(f"\n{prog}: stopped: {e}", file=sys.stderr)
            sys.exit(e.status)
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"\n{prog}: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        sys.exit(128 + signum)
    except Exception as e:  # noqa: BLE001 -- sorted into expected errors and bugs just below
        line = error_line(e)
        if line is None:
            raise
        print(f"{prog}: error: {line}", file=sys.stderr)
        sys.exit(2)
    finally:  # SIGTERM as the caller had it, unless we are exiting on an interrupt
        if not interrupted and previous is not None:
            signal.signal(signal.SIGTERM, previous)
