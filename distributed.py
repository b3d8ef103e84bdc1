"""
Several processes for train_rl.py: `torchrun --nproc_per_node N train_rl.py ...` starts N copies of it.
Each rank samples and grades a contiguous share of the step's problems (whole groups, with the problems' own
seeds, so what is drawn does not depend on the number of ranks) and the rollouts are gathered: every rank
then computes the same advantages, batch and metrics. Each trains on a share of the batch rows, and the
gradients are summed: the loss divides by batch-wide counts, so a rank's loss is its share of the batch
loss. Rank 0 writes the run directory. Without torchrun's variables all of this is a no-op.

Also here: the whole copy of the policy that sampling uses (sampling_copy): the policy itself on a CPU, a bf16
copy on a GPU, and under FSDP, where the policy holds only shards, a whole copy on every rank.
"""

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

import checkpoint
import cli
import lora
from model import token_logprobs


@dataclass
class DistributedConfig:
    """train_rl.py's flag for several GPUs (train_rl.Config inherits it); torchrun's variables do the rest."""
    fsdp: bool = cli.arg(False, "under torchrun: shard parameters, gradients and optimizer state (FSDP2)",
                         group="several GPUs")


def setup_distributed(device):
    """Under torchrun (WORLD_SIZE set) join the process group, NCCL on CUDA and gloo on CPU, unless one is
    joined already; returns this rank's device (cuda:LOCAL_RANK). Other ranks print nothing (repeats)."""
    if "WORLD_SIZE" not in os.environ:
        return device
    if device.startswith("cuda"):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    if dist.get_rank() != 0:
        sys.stdout = open(os.devnull, "w")
    return device


def shutdown():
    if dist.is_initialized():
        dist.destroy_process_group()


def this_rank():
    return dist.get_rank() if dist.is_initialized() else 0


def world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier():
    if world_size() > 1:
        dist.barrier()


def rank_share(items, rank=None, world=None):
    """This rank's contiguous share of a list, items[r * n // W:(r + 1) * n // W]: the shares in rank order
    are the list again, and their sizes differ by at most one."""
    rank, world = this_rank() if rank is None else rank, world_size() if world is None else world
    return items[rank * len(items) // world:(rank + 1) * len(items) // world]


def gather_lists(items):
    """Every rank's list (of picklable items), concatenated in rank order, on every rank."""
    if world_size() == 1:
        return items
    parts = [None] * world_size()
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def reduce_numbers(values, op="sum"):
    """Numbers (int, float, bool) summed (op "sum") or maxed ("max") over the ranks, each keeping its type."""
    if world_size() == 1:
        return values
    t = torch.tensor([float(v) for v in values], dtype=torch.float64,
                     device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, getattr(dist.ReduceOp, op.upper()))
    return [type(v)(x) for v, x in zip(values, t.tolist())]


def shared_rollouts(sample_and_score, batch, seeds, tally):
    """train_rl.sample_and_score over several processes: this rank samples and grades its share of the problems
    (each with its own seed), and every rank gets every rollout back, so all make the same choices after; the tally's
    checks with no verdict are summed over the ranks (its seconds stay this rank's)."""
    errors = tally["unverified"]
    rollouts = sample_and_score(rank_share(batch), rank_share(seeds))
    tally["unverified"] = errors + sum(gather_lists([tally["unverified"] - errors]))
    return gather_lists(rollouts)


def sum_over_ranks(policy, sums, nonfinite):
    """update.policy_update over several processes, after an epoch's micro-batches: the ranks' shares of the
    statistics `sums` (a dict of numbers) and of the gradients added up, and the update skipped on every rank or on
    none (nonfinite: any rank's). Returns (sums, nonfinite)."""
    *totals, nonfinite = reduce_numbers([*sums.values(), nonfinite])
    all_reduce_gradients(policy)
    return dict(zip(sums, totals)), nonfinite


def all_reduce_gradients(policy):
    """Sum the gradients over the ranks. One all-reduce per tensor after accumulation rather than DDP's hooks
    in backward, because ranks may run different numbers of micro-batches (or none). FSDP sums its own."""
    if world_size() == 1 or is_sharded(policy):
        return
    grads = []
    for p in policy.parameters():
        if p.requires_grad:
            if p.grad is None:  # this rank's share of the batch was empty
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    for work in [dist.all_reduce(g, async_op=True) for g in grads]:  # issued together, so transfers overlap
        work.wait()


def pad_micro_batches(batches, policy):
    """FSDP: every rank must run as many forward/backward passes as the others, so the shorter lists of
    micro-batches get empty ones (padding_pass runs them); unchanged without FSDP."""
    if not is_sharded(policy):
        return batches
    return batches + [[]] * (reduce_numbers([len(batches)], "max")[0] - len(batches))


def padding_pass(policy, pad_id, device):
    """An empty micro-batch's pass: zero gradient, but it joins the other ranks' collectives."""
    token_logprobs(policy, torch.full((1, 2), pad_id, device=device))[0].sum().mul(0).backward()


def shard_model(policy):
    """--fsdp: FSDP2 over every decoder layer, then the root (embeddings, final norm, LM head). Each rank keeps
    1/N of every parameter, gradient and optimizer moment and gathers a layer's weights only to run it."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
    for block in policy.model.layers:
        fully_shard(block)
    fully_shard(policy)
    register_fsdp_forward_method(policy, "hidden_states")  # M.token_logprobs calls it instead of forward
    for module in (*policy.model.layers, policy):
        module.set_gradient_divide_factor(1.0)  # sum, not average, as all_reduce_gradients
        module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-scaled sum
    return policy


def is_sharded(policy):
    from torch.distributed.fsdp import FSDPModule
    return isinstance(policy, FSDPModule)


def whole(t):
    """A tensor, with FSDP's shards (a DTensor) gathered into the whole tensor on every rank."""
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def renumbered(opt_state, key):
    """An optimizer state dict with its parameters renamed by key (index <-> name)."""
    return dict(state={key[k]: v for k, v in opt_state["state"].items()},
                param_groups=[dict(g, params=[key[p] for p in g["params"]]) for g in opt_state["param_groups"]])


def gathered_state(policy, optimizer):
    """--fsdp: (weights, optimizer state) with whole tensors on rank 0's CPU, the optimizer's numbered as a
    plain optimizer numbers its parameters, so the checkpoint files are the same as without FSDP."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # other ranks get empty dicts
    weights = get_model_state_dict(policy, options=options)
    if not optimizer.state:  # no update yet; get_optimizer_state_dict would create a state (a zero step)
        return weights, optimizer.state_dict()
    opt_state = get_optimizer_state_dict(policy, optimizer, options=options)
    index = {name: i for i, (name, _) in enumerate(policy.named_parameters())}
    return weights, (renumbered(opt_state, index) if opt_state else opt_state)


def load_sharded_optimizer_state(policy, optimizer, opt_state):
    """--fsdp: load a whole (plain-numbered) optimizer state; each rank keeps the shards of its parameters."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    names = dict(enumerate(name for name, _ in policy.named_parameters()))
    set_optimizer_state_dict(policy, optimizer, renumbered(opt_state, names),
                             options=StateDictOptions(full_state_dict=True))


# -----------------------------------------------------------------------------
# The copy of the policy that samples


def plain_model(policy, state=None):
    """The policy as an ordinary (or looped) Qwen3 with LoRA adapters merged, sharing tensors where it can; or with
    the weights `state` (FSDP's gathered ones)."""
    plain = checkpoint.empty_model(policy.config)
    if state is None:
        state = lora.merged_state_dict(policy) if has_lora(policy) else policy.state_dict()
    plain.load_state_dict(state, assign=True)
    if policy.config.tie_word_embeddings:
        plain.lm_head.weight = plain.model.embed_tokens.weight
    return plain


def has_lora(policy):
    return any(isinstance(m, lora.LoRALinear) for m in policy.modules())


def sampling_copy(policy, device):
    """CPU: the fp32 policy itself. GPU: a bf16 copy, refreshed after every update. With --fsdp the policy holds
    only shards, so each rank samples from a whole copy (fp32 on CPU)."""
    if is_sharded(policy):
        copy = checkpoint.empty_model(policy.config)
        copy = copy.to_empty(device=device).to(torch.bfloat16 if device.startswith("cuda") else torch.float32)
        if policy.config.tie_word_embeddings:
            copy.lm_head.weight = copy.model.embed_tokens.weight
        refresh_sampling_copy(copy, policy)
        return copy.eval()
    return policy if not device.startswith("cuda") else plain_model(policy).to(torch.bfloat16).eval()


def refresh_sampling_copy(copy, policy):
    """The copy takes the policy's new weights (a no-op when it is the policy)."""
    if copy is policy:
        return
    if is_sharded(policy):  # gather one tensor at a time: no rank ever holds a second whole fp32 model
        with torch.no_grad():
            target = copy.state_dict()
            for name, t in policy.state_dict().items():
                target[name].copy_(whole(t))
        return
    copy.load_state_dict(plain_model(policy).state_dict())
