"""
Position coupling (`tiny.py --couple`; Cho et al. 2024, "Position Coupling", arXiv 2405.20671): the tiny world's
solution line k sits at the rotary positions of the problem's number it uses, so a line and its operand are the
same distance apart on every line, and a longer chain shows the model no distance it has not seen. Cho et al. couple
digits of equal significance in addition; a chain's line and its operand are this task's pair (a solution's line k
uses the chain's (k + 1)-th number: tests/test_tiny.py checks the generator for it).

A coupled checkpoint says model_type "coupled_qwen3" (transformers refuses it, rather than run it with the plain
positions) and keeps the token ids the positions read in config.json's `position_coupling`; importing this module
adds its row to checkpoint.MODEL_TYPES (model_options.py imports it, so evaluate.py and the scripts that import it
load one). Such a model decodes on the sampler's chunks engine, whose cache keeps the tokens coupling reads.
"""

from dataclasses import dataclass

import torch

import checkpoint
from model import KVCache, Qwen3, Qwen3Config


@dataclass
class CoupledQwen3Config(Qwen3Config):
    """Qwen3's config plus the token ids coupled_positions reads (our own config.json key)."""
    position_coupling: dict = None  # {"colon": id, "newline": id, "digits": [ten ids]}

    MODEL_TYPE, ARCHITECTURE = "coupled_qwen3", "CoupledQwen3ForCausalLM"  # unknown to transformers, on purpose

    def check(self, source):
        super().check(source)
        pc = self.position_coupling
        shaped = isinstance(pc, dict) and set(pc) == {"colon", "newline", "digits"} and \
            isinstance(pc["digits"], list) and len(pc["digits"]) == 10
        ids = [pc["colon"], pc["newline"], *pc["digits"]] if shaped else []
        if not (shaped and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.vocab_size
                               for i in ids)):
            raise ValueError(f"{source}: position_coupling={pc!r} must be {{\"colon\": id, \"newline\": id, "
                             f"\"digits\": [10 ids]}}, token ids below vocab_size {self.vocab_size}")


def coupled_positions(ids, pad, coupling):
    """Rotary positions (B, L) of token ids (B, L), row b left-padded by pad[b], for a prompt "...Problem:\\n<chain>
    \\n\\nSolution:" and a completion of one operation a line ("\\n16 + 30 = 46"). The prompt keeps its positions; the
    c-th token of completion line k (its newline is c = 0) sits at p[k + 1] + c, where p[j] is the position of the
    first digit of the chain's j-th number, and past the last number the completion's first position. Causal: a
    token's position reads no later token (the colons, digits and newlines before it)."""
    B, L = ids.shape
    index = torch.arange(L, device=ids.device)[None]
    plain = index - pad[:, None]
    colon = ids == coupling["colon"]
    colons_before = colon.cumsum(1) - colon.long()
    completion = colons_before >= 2  # after "Problem:" and "Solution:"
    digit = torch.isin(ids, torch.tensor(coupling["digits"], device=ids.device))
    after_digit = torch.cat([torch.zeros_like(digit[:, :1]), digit[:, :-1]], 1)
    first_digit = digit & ~after_digit & (colons_before == 1)
    number = first_digit.cumsum(1)  # 1-based: which number of the chain a first digit starts
    n = int(number.max()) if L else 0
    start = torch.where(colon & (colons_before == 1), plain + 1, -1).amax(1, keepdim=True)  # after "Solution:"
    p = start.expand(B, n + 2).clone()
    p.scatter_(1, torch.where(first_digit, number, 0), torch.where(first_digit, plain, start))  # column 0 unused
    newline = (ids == coupling["newline"]) & completion
    line = newline.cumsum(1)
    c = index - torch.where(newline, index, 0).cummax(1).values
    coupled = p.gather(1, (line + 1).clamp(max=n + 1)) + c
    return torch.where(completion & (line >= 1), coupled, plain)


class CoupledCache(KVCache):
    """model.KVCache that also keeps each row's tokens (ids), which a coupled position reads."""

    def __init__(self, config, batch_size, max_len, device=None, dtype=torch.float32):
        super().__init__(config, batch_size, max_len, device, dtype)
        self.ids = torch.zeros((batch_size, max_len), dtype=torch.long, device=device)

    def token_ids(self, input_ids):  # (B, length + T): the rows' tokens so far, the next T written in
        self.ids[:, self.length:self.length + input_ids.shape[1]] = input_ids
        return self.ids[:, :self.length + input_ids.shape[1]]

    def rows(self, start, end):
        view = super().rows(start, end)
        view.ids = self.ids[start:end]
        return view

    def compact(self, keep):
        super().compact(keep)
        self.ids = self.ids[keep]

    def select(self, rows):
        super().select(rows)
        self.ids = self.ids[torch.as_tensor(rows, dtype=torch.long, device=self.ids.device)]


class CoupledQwen3(Qwen3):
    """Qwen3 with coupled_positions in place of each token's own position; the weights are a plain Qwen3's."""

    def hidden_states(self, input_ids, cache=None, positions=None):
        """As Qwen3's, at the coupled positions of the row's tokens so far (the cache's, or input_ids alone)."""
        if cache is None:
            ids, pad = input_ids, torch.zeros(len(input_ids), dtype=torch.long, device=input_ids.device)
        else:  # CoupledCache, or tiny.SharedPrefix in pretraining
            ids, pad = cache.token_ids(input_ids), cache.pad
        positions = coupled_positions(ids, pad, self.config.position_coupling)[:, -input_ids.shape[1]:]
        return super().hidden_states(input_ids, cache, positions)

    def new_cache(self, batch_size, max_len, kind=CoupledCache):
        return super().new_cache(batch_size, max_len, kind)


checkpoint.MODEL_TYPES[CoupledQwen3Config.MODEL_TYPE] = (CoupledQwen3Config, CoupledQwen3, None)
