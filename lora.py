"""
LoRA (Hu et al. 2021): train a low-rank update W + (alpha / r) * B @ A of each linear layer, the base frozen.

`add_lora` wraps the attention and MLP projections in place; `merged_state_dict` folds the adapters back
into plain weights with the Hugging Face names, so checkpoints stay ordinary Qwen3 checkpoints.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

import cli

arg = cli.arg_group("LoRA")  # the flags below show under "LoRA" in train_rl.py --help


@dataclass
class LoraConfig:
    """train_rl.py's LoRA flags (train_rl.Config inherits them)."""
    lora_rank: int = arg(0, "LoRA rank (0: full fine-tuning)", range="[0, inf)")
    lora_alpha: float = arg(16.0, "LoRA alpha (the update is scaled by alpha / rank)")


TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # B = 0: training starts at the base model

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t().to(x.dtype)) @ self.lora_B.t().to(x.dtype) * self.scale

    def merged_weight(self):
        return self.base.weight + (self.lora_B @ self.lora_A).to(self.base.weight.dtype) * self.scale


def add_lora(model, rank, alpha):
    """Freeze the model and wrap every target projection with a trainable adapter; returns the model."""
    for p in model.parameters():
        p.requires_grad_(False)
    for module in list(model.modules()):
        for name in TARGETS:
            child = getattr(module, name, None)
            if isinstance(child, nn.Linear):
                setattr(module, name, LoRALinear(child, rank, alpha))
    return model


def merged_state_dict(model):
    """The model's weights with adapters folded in, under the plain (Hugging Face) names. An adapter whose base is
    not its own submodule (model.Loop's per-loop adapters, on weights other passes share) cannot fold in: it stays."""
    state, kept = {}, []
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear) and "base" in module._modules:
            state[f"{name}.weight"] = module.merged_weight().detach()
        elif isinstance(module, LoRALinear):
            kept.append(name + ".")
    for name, tensor in model.state_dict().items():
        if (".lora_" in name and not name.startswith(tuple(kept))) or ".base." in name:
            continue
        state[name] = tensor
    return state


def adapter_state_dict(model):
    return {k: v.detach() for k, v in model.state_dict().items() if ".lora_" in k}
