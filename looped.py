"""
Looped depth (`--loop START:END:N`): layers [START, END) of a Qwen3 run N times per token with shared weights,
recurrent depth at the same parameter count (Geiping et al. 2025, Huginn; McLeish et al. 2025; Bae et al. 2024).

Loop 1 is the plain model; loop k > 1 updates the residual stream by h <- h + a_k * D(h + s_k), where
D(x) = R(x) - x is the residual update of the looped layers R on their input, a_k a per-channel gate and s_k a
loop embedding, both zero at initialisation. So a looped model starts as exactly the pretrained one (0 * D = 0
and h + 0 = h in floating point) and training opens the extra loops; published retrofits instead heal on
billions of tokens. Every (layer, loop) pass has its own KV-cache row and counts in the FLOPs
(config.layer_passes). A looped checkpoint says model_type "looped_qwen3" (transformers refuses it) and keeps
its own tensors in loop.safetensors: importing this module adds that row to checkpoint.MODEL_TYPES, so that
checkpoint.py reads and writes both (export_plain writes the shared weights as a plain Qwen3). The study:
research/looped/.
"""

import copy
import dataclasses
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn

import checkpoint
import cli
import lora
from model import Qwen3, Qwen3Config

arg = cli.arg_group("looped depth")  # the flags below show under "looped depth" in train_rl.py --help


@dataclass
class LoopConfig:
    """train_rl.py's looped-depth flags (train_rl.Config inherits them)."""
    loop: str = arg("", "looped depth START:END:N: layers [START, END) run N times, weights shared, gates zero so "
                        "training starts from exactly --model (looped.py; '': plain)")
    loop_lr: float = arg(0.0, "learning rate of the loop's gates and embeddings (0: --lr)", range="[0, inf)")
    loop_lora_rank: int = arg(0, "--loop: a LoRA adapter per extra loop on the looped layers (0: none)",
                              range="[0, inf)")


LOOP_KEYS = ("loop_start", "loop_end", "loop_count", "loop_lora_rank", "loop_lora_alpha")


@dataclass
class LoopedQwen3Config(Qwen3Config):
    """Qwen3's config plus the loop (our own config.json keys): layers [loop_start, loop_end) run loop_count >= 2
    times with shared weights, optionally with per-loop LoRA adapters on their projections."""
    loop_start: int = 0
    loop_end: int = 1
    loop_count: int = 2
    loop_lora_rank: int = 0  # per-loop LoRA adapters on the looped layers' projections (0: none)
    loop_lora_alpha: float = 16.0

    MODEL_TYPE, ARCHITECTURE = "looped_qwen3", "LoopedQwen3ForCausalLM"  # unknown to transformers, on purpose

    @property
    def layer_passes(self):
        """Every layer once, plus the looped ones loop_count - 1 more times."""
        return self.num_hidden_layers + (self.loop_count - 1) * (self.loop_end - self.loop_start)

    @property
    def extra_parameters(self):
        """Gates, embeddings and per-loop adapters."""
        return (self.loop_count - 1) * (2 * self.hidden_size + (self.loop_end - self.loop_start) * loop_lora_weights(self))

    @property
    def extra_matmul_weights(self):
        """The per-loop adapters, run in every extra loop (the gates and embeddings are elementwise)."""
        return (self.loop_count - 1) * (self.loop_end - self.loop_start) * loop_lora_weights(self)

    def check(self, source):
        super().check(source)
        if self.loop_count < 2:
            raise ValueError(f"{source}: model_type {self.MODEL_TYPE!r} without loop_count >= 2")
        check_loop(self.loop_start, self.loop_end, self.loop_count, self.num_hidden_layers, f"{source}: loop")


def check_loop(start, end, count, num_layers, name="--loop"):
    """Refuse a loop that cannot run, naming the flag; num_layers None checks all but the model's range."""
    spec = f"{name} {start}:{end}:{count}"
    if end <= start:
        raise ValueError(f"{spec}: END must be > START")
    if start < 0:
        raise ValueError(f"{spec}: START must be >= 0")
    if num_layers is not None and end > num_layers:
        raise ValueError(f"{spec}: the looped layers [START, END) must lie within the model's {num_layers} layers "
                         f"(END <= {num_layers})")
    if count < 1:
        raise ValueError(f"{spec}: N must be >= 1 (1 is the plain model)")


def parse_loop(spec, num_layers):
    """A --loop value `START:END:N` -> (start, end, n), checked against the model's layer count (None: all but
    that); '' -> None."""
    if not spec:
        return None
    try:
        start, end, count = (int(x) for x in str(spec).split(":"))
    except ValueError:
        raise ValueError(f"--loop {spec}: expected START:END:N (integers; layers [START, END) run N times), "
                         f"e.g. 12:16:2") from None
    check_loop(start, end, count, num_layers)
    return start, end, count


def loop_spec(config):
    """`START:END:N` of a looped config, '' for a plain one."""
    c = config
    return f"{c.loop_start}:{c.loop_end}:{c.loop_count}" if isinstance(c, LoopedQwen3Config) else ""


def adapted_view(block, rank, alpha):
    """A Block that shares every module of `block` but runs each projection through its own LoRA adapter
    (lora.LoRALinear on the shared Linear); returns (view, adapters). The view is registered nowhere and the
    adapters do not register their base, so the shared weights appear once in parameters() and state_dict()."""
    view = copy.copy(block)
    view._modules = dict(block._modules)
    adapters = nn.ModuleDict()
    for part in ("self_attn", "mlp"):
        sub = copy.copy(block._modules[part])
        sub._modules = dict(sub._modules)
        for name in lora.TARGETS:
            if name in sub._modules:
                base = sub._modules[name]
                adapter = lora.LoRALinear(base, rank, alpha)  # B = 0: the adapted pass starts as the shared one
                del adapter._modules["base"]
                adapter.__dict__["base"] = base  # shared with the other passes, not a submodule of the adapter
                sub._modules[name] = adapters[f"{part}_{name}"] = adapter
        view._modules[part] = sub
    return view, adapters


class Loop(nn.Module):
    """The looped model's own parameters (named `loop.*`, saved in loop.safetensors): gate a_k and embedding s_k of
    each extra loop, (N - 1, hidden), zero at initialisation; with loop_lora_rank, a LoRA adapter per extra loop on
    each projection of the looped layers (Relaxed Recursive Transformers, Bae et al. 2024), off by default."""

    def __init__(self, c, layers):
        super().__init__()
        extra = c.loop_count - 1
        self.gate = nn.Parameter(torch.zeros(extra, c.hidden_size))
        self.embed = nn.Parameter(torch.zeros(extra, c.hidden_size))
        self.lora = nn.ModuleList()
        self.views = []  # views[k - 1][i - loop_start]: layer i in loop k > 0, through that loop's adapters
        for _ in range(extra if c.loop_lora_rank else 0):
            pairs = [adapted_view(layers[i], c.loop_lora_rank, c.loop_lora_alpha)
                     for i in range(c.loop_start, c.loop_end)]
            self.views.append([view for view, _ in pairs])
            self.lora.append(nn.ModuleList(adapters for _, adapters in pairs))


def loop_lora_weights(config):
    """Weights of one looped layer's per-loop adapters: rank x (in + out) for each of its 7 projections."""
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return c.loop_lora_rank * (7 * c.hidden_size + 2 * q + 2 * kv + 3 * c.intermediate_size)



class LoopedQwen3(Qwen3):
    """A Qwen3 whose layers [loop_start, loop_end) run loop_count times (the module docstring)."""

    def __init__(self, config):
        super().__init__(config)
        self.loop = Loop(config, self.model.layers)

    @classmethod
    def from_plain(cls, model, config):
        """The looped model over a plain one's modules (its weights shared, not copied), the loop's own
        parameters new: gates and embeddings zero, adapters initialised as lora.LoRALinear does."""
        looped = cls.__new__(cls)
        nn.Module.__init__(looped)
        looped.config, looped.model, looped.lm_head = config, model.model, model.lm_head
        looped.gradient_checkpointing = model.gradient_checkpointing
        looped.name_or_path = getattr(model, "name_or_path", None)
        p = model.lm_head.weight
        with torch.device(p.device):
            looped.loop = Loop(config, looped.model.layers).to(p.dtype)
        return looped.train(model.training)

    def decoder_layers(self, x, cos, sin, cache, mask):
        """Layers [0, S), then [S, E) N times, then [E, L); each pass its own cache row, in the order they run."""
        c, layers, loop = self.config, self.model.layers, self.loop
        x, slot = self.run_layers(layers[:c.loop_start], x, cos, sin, cache, mask, 0)
        x, slot = self.run_layers(layers[c.loop_start:c.loop_end], x, cos, sin, cache, mask, slot)  # loop 1: plain
        for k in range(1, c.loop_count):
            blocks = loop.views[k - 1] if loop.views else layers[c.loop_start:c.loop_end]
            h = x
            x_in = h + loop.embed[k - 1]
            x, slot = self.run_layers(blocks, x_in, cos, sin, cache, mask, slot)
            # at a_k = 0 the gate's gradient is D(h + s_k), non-zero, but s_k's is a_k * (...) = 0: the loop
            # embedding starts to move once its gate has
            x = h + loop.gate[k - 1] * (x - x_in)
        x, _ = self.run_layers(layers[c.loop_end:], x, cos, sin, cache, mask, slot)
        return x


# A looped checkpoint's row: model_type "looped_qwen3", its own tensors (Loop's, named loop.*) in loop.safetensors
checkpoint.MODEL_TYPES[LoopedQwen3Config.MODEL_TYPE] = (LoopedQwen3Config, LoopedQwen3, "loop")


def add_loop(model, spec, lora_rank=0, lora_alpha=16.0):
    """The model looped by `spec` (a --loop value START:END:N), sharing its weights; at initialisation it computes
    exactly the plain model's logits. '' and N = 1 return the model itself. A model that is already looped keeps
    its loop, which `spec`, when given, must equal."""
    c = model.config
    parsed = parse_loop(spec, c.num_hidden_layers)
    if isinstance(c, LoopedQwen3Config):  # a looped checkpoint
        if parsed is not None and (parsed, lora_rank) != ((c.loop_start, c.loop_end, c.loop_count), c.loop_lora_rank):
            raise ValueError(f"--loop {spec}: the model is already looped ({loop_spec(c)}, loop LoRA rank "
                             f"{c.loop_lora_rank}); drop --loop or give its own loop")
        return model
    if parsed is None or parsed[2] == 1:
        return model
    if lora_rank < 0:
        raise ValueError(f"--loop-lora-rank must be >= 0, got {lora_rank}")
    if any(isinstance(m, lora.LoRALinear) for m in model.modules()):
        raise ValueError("--loop on a model with LoRA adapters is not supported: add the loop first")
    start, end, count = parsed
    config = LoopedQwen3Config(**dataclasses.asdict(c), loop_start=start, loop_end=end, loop_count=count,
                               loop_lora_rank=lora_rank, loop_lora_alpha=lora_alpha)
    return LoopedQwen3.from_plain(model, config)


def param_groups(model, lr, loop_lr):
    """AdamW parameter groups: the trainable weights at lr, and the loop's gates and embeddings in a group of their
    own at loop_lr (0: lr) without weight decay (it would pull the gates shut). lr_scale is each group's lr over lr,
    which the loop's schedule multiplies (train_rl.set_lr)."""
    params = [p for p in model.parameters() if p.requires_grad]
    loop = getattr(model, "loop", None)
    loop_ids = {id(loop.gate), id(loop.embed)} if loop is not None else set()
    groups = [dict(params=[p for p in params if id(p) not in loop_ids], lr_scale=1.0)]
    if loop_ids:
        groups.append(dict(params=[p for p in params if id(p) in loop_ids], weight_decay=0.0,
                           lr_scale=(loop_lr or lr) / lr if lr else 1.0))
    return groups


def plain_config(config):
    """The Qwen3Config of a looped one: its shared weights' shape, without the loop."""
    return Qwen3Config(**{k: v for k, v in dataclasses.asdict(config).items() if k not in LOOP_KEYS})


def export_plain(model, path, tokenizer=None):
    """Write a looped model's shared weights (a model, or a looped checkpoint's path) as a plain Qwen3 checkpoint
    that transformers and vLLM load. This drops the extra loops and their parameters: the export computes the
    looped model's logits only while every gate is zero (at initialisation); after training it is another model.
    Returns (path, the largest |gate| dropped) and says so on stderr."""
    if not isinstance(model, nn.Module):
        if tokenizer is None and (checkpoint.resolve_model_dir(model) / "tokenizer.json").is_file():
            tokenizer = checkpoint.load_tokenizer(model)
        model = checkpoint.load_model(model, dtype=torch.float32, device="cpu")
    c = model.config
    with torch.device("meta"):
        plain = Qwen3(plain_config(c))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("loop.")}, assign=True)
    if c.tie_word_embeddings:
        plain.lm_head.weight = plain.model.embed_tokens.weight
    loop = getattr(model, "loop", None)
    gate = float(loop.gate.detach().abs().max()) if loop is not None else 0.0
    if loop is not None:
        print(f"export_plain: wrote the shared weights of a --loop {loop_spec(c)} model as a plain Qwen3 to "
              f"{path}; its extra loops are dropped (largest |gate| {gate:.3g}), so it computes the looped model's "
              f"logits only if that is 0", file=sys.stderr)
    return checkpoint.save_model(plain, path, tokenizer), gate


def loop_metrics(model):
    """What a run logs about looped depth: layer passes per token, the extra parameters, and per extra loop the
    mean |gate| and the RMS of its embedding; {} for a plain model."""
    loop = getattr(model, "loop", None)
    if loop is None:
        return {}
    with torch.no_grad():
        return dict(layer_passes=model.config.layer_passes, loop_parameters=model.config.extra_parameters,
                    loop_gate_abs=[float(a.abs().mean()) for a in loop.gate.float()],
                    loop_embed_rms=[float(s.square().mean().sqrt()) for s in loop.embed.float()])
