"""
The model options evaluate.py puts on a checkpoint once it is loaded: today looped depth (`--loop START:END:N`,
looped.py). evaluate.py takes them through this one seam, so the core names no option; no flag given is the
checkpoint as it is. Importing this module imports looped.py, which adds the looped checkpoint's row to
checkpoint.MODEL_TYPES: evaluate.py, and every script that imports it, loads a looped checkpoint too; coupled.py's
row (position coupling, tiny.py --couple) comes the same way.
"""

from dataclasses import dataclass

import checkpoint
import cli
import coupled  # noqa: F401  (its row in checkpoint.MODEL_TYPES: evaluate.py loads a coupled checkpoint)
import looped

arg = cli.arg_group("model options")


@dataclass
class ModelOptions:
    """evaluate.py's model options (its EvalConfig inherits them; train_rl.py takes looped.LoopConfig's)."""
    loop: str = arg("", "looped depth START:END:N on a plain checkpoint: layers [START, END) run N times with shared "
                        "weights and zero gates, so the logits stay the plain model's and only the compute grows "
                        "(looped.py; a looped checkpoint keeps its own loop)")


def check(cfg, model_config=None):
    """Refuse option values that cannot run, naming the flag: their syntax, and given the checkpoint's config (read
    before any weight) what depends on the model, --loop's layer range."""
    looped.parse_loop(cfg.loop, model_config.num_hidden_layers if model_config else None)


def load_model(cfg, dtype, device):
    """checkpoint.load_model(cfg.model) with the options on: looped by --loop (a looped checkpoint keeps its own)."""
    return looped.add_loop(checkpoint.load_model(cfg.model, dtype=dtype, device=device), cfg.loop)


def settings(model):
    """What an evaluation's settings.json records of a model's options, a protocol key each: its loop ('' plain)."""
    return dict(loop=looped.loop_spec(model.config))
