"""The repo's layout keeps its promises: the core reads in one sitting, imports neither the tiny world nor a
research program, research uses the core's public names and no research program imports another
(benchmarks/import_graph.py, by ast)."""

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "benchmarks" / "import_graph.py")
IG = importlib.util.module_from_spec(spec)
spec.loader.exec_module(IG)


def test_the_core_imports_no_tiny_world_and_no_research_and_research_uses_public_names():
    g = IG.graph()
    assert {"train_rl.py", "research/rounds/rounds.py", "research/report.py"} <= set(g)
    assert IG.broken_rules(g) == []
    assert "tiny" not in g["train_rl.py"][0] and "tiny" not in g["evaluate.py"][0]  # the MATH path, by name


def test_the_rules_catch_what_they_forbid():
    g = {"train_rl.py": (["model", "tiny"], []), "evaluate.py": (["research/bands/bands"], []),
         "research/x/y.py": (["train_rl"], [("train_rl", "_secret")]), "model.py": (["sample"], []),
         "sample.py": (["model"], []), "benchmarks/bench_verify.py": (["verify"], [("verify", "_number")])}
    assert IG.broken_rules(g) == [
        "train_rl.py imports tiny: the core and its options never import the tiny world or research",
        "evaluate.py imports research/bands/bands: the core and its options never import the tiny world or research",
        "research/x/y.py uses train_rl._secret: research uses the core's public names only",
        "model.py and sample.py import each other"]


def test_a_research_program_never_imports_another(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from research.bands import bands as B\nimport research.rounds.rounds\nimport runs\n")
    imports, _ = IG.imports_of(probe, {"runs"})
    assert imports == ["research/bands/bands", "research/rounds/rounds", "runs"]
    g = {"research/ladder/ladder.py": (imports, []),
         "research/rounds/rounds_table.py": (["research/rounds/rounds"], []),  # its own program: fine
         "research/report.py": (["research/bands/bands"], [])}  # the report over every program's outputs: fine
    assert IG.broken_rules(g) == [
        "research/ladder/ladder.py imports research/bands/bands: a research program never imports another",
        "research/ladder/ladder.py imports research/rounds/rounds: a research program never imports another"]


def test_a_program_may_import_a_shared_research_module_that_imports_no_program():
    g = {"research/hint.py": ([], []), "research/report.py": (["research/bands/bands"], []),
         "research/rounds/rounds.py": (["research/hint/hinted"], []),  # `from research.hint import hinted`
         "research/ladder/ladder.py": (["research/hint", "research/report"], [])}
    assert IG.broken_rules(g) == [  # report.py reads the programs: through it, ladder would import bands
        "research/ladder/ladder.py imports research/report: a research program never imports another"]


def test_the_loader_and_the_evaluation_name_no_model_option():
    """checkpoint.py and evaluate.py reach looped depth through their seams only: checkpoint.MODEL_TYPES, which
    looped.py adds its row to, and model_options.py, evaluate.py's model options. Neither imports looped.py nor
    names it (issue #66)."""
    g = IG.graph()
    for name in ("checkpoint.py", "evaluate.py"):
        for option in ("looped", "coupled"):
            assert option not in g[name][0] and option not in (ROOT / name).read_text().lower(), (name, option)
    assert "model_options" in g["evaluate.py"][0] and {"looped", "coupled"} <= set(g["model_options.py"][0])
    assert "checkpoint" in g["looped.py"][0] and "checkpoint" in g["coupled.py"][0]


def test_private_names_are_found_through_any_alias(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("import train_rl as T\nfrom verify import _number, grade\nT._hidden()\nT.public()\n")
    imports, private = IG.imports_of(path, {"train_rl", "verify"})
    assert imports == ["train_rl", "verify"] and sorted(private) == [("train_rl", "_hidden"), ("verify", "_number")]


def test_core_files_read_in_one_sitting():
    """No core or option file over ~600 lines: a longer one holds two concepts (verify.py's symbolic half is
    symbolic.py)."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in ROOT.glob("*.py")}
    assert set(sizes) >= {f"{m}.py" for m in IG.CORE + IG.OPTIONS}
    too_long = {name: n for name, n in sizes.items() if n > 630}
    assert not too_long, too_long


# -----------------------------------------------------------------------------
# The plain path: what one Dr. GRPO step runs, from rl_step down to optimizer.step() (issue #56)

# Every function of the repo the README's main command runs in one step, in the order of first call (the tiny world,
# 1 thread, no option on); test_the_plain_path_is_what_a_step_runs traces it again with sys.setprofile.
PLAIN_PATH = [
    "train_rl.rl_step", "train_rl.lr_at", "train_rl.set_lr", "train_rl.draw_rollouts", "train_rl.problems_for_step",
    "train_rl.sampling_seeds", "train_rl.sample_and_score", "train_rl.collect_rollouts", "problems.format_prompt",
    "checkpoint.Tokenizer.encode", "checkpoint.Tokenizer.stop_token_ids", "sample.generate",
    "sample.default_token_budget", "sample.kv_bytes_per_token", "model.Qwen3Config.layer_passes",
    "sample.check_request", "sample.prompt_seeds", "sample.generate_chunks", "sample.plan_chunks",
    "sample.pack_by_length", "sample.generate_chunk", "sample.Request.start", "sample.row_generators",
    "sample.prefill", "model.Qwen3.new_cache", "model.KVCache.__init__", "model.KVCache.rows",
    "model.Qwen3.forward", "model.Qwen3.hidden_states", "model.KVCache.positions", "model.KVCache.attention_mask",
    "model.rope_cos_sin", "model.Qwen3.decoder_layers", "model.Qwen3.run_layers", "model.Block.forward",
    "model.RMSNorm.forward", "model.Attention.forward", "model.Linear.forward", "model.apply_rope",
    "model.swap_halves", "model.KVCache.update", "model.KVCache.max_len", "model.MLP.forward",
    "model.KVCache.advance", "model.KVCache.select", "sample.draw_tokens", "sample.sample_next",
    "sample.sampling_logprobs", "sample.decode_step", "model.KVCache.batch_size", "model.KVCache.compact",
    "checkpoint.Tokenizer.decode", "reward.score", "verify.grade_with", "verify.grade_batch",
    "verify.extract_answer", "verify.is_equivalent", "verify.normalize_answer", "symbolic.check_clock",
    "verify._equiv", "verify._number", "verify._numbers_equal", "reward.pay", "reward.correctness",
    "objectives.group_advantages", "update.policy_update", "update.micro_batches", "update.micro_batch",
    "update.rollout_tensors", "update.sequence_tensors", "update.completion_values", "update.autocast",
    "model.token_logprobs", "update.old_logprobs", "objectives.truncated_is_weights", "objectives.drgrpo_loss",
    "objectives.ppo_terms", "objectives.kl_penalty", "update.add_token_stats", "update.apply_gradients",
]
PLAIN_PATH_BUDGET = 703  # source lines in at most 10 files (issue #66); measured 698 in 10 when it was retraced, 701 with
# coupled.py's two seams (issue #67: positions a model option passes, and its engine, the chunks)


def plain_path_function(name):
    module, *attrs = name.split(".")
    obj = importlib.import_module(module)
    for attr in attrs:
        obj = getattr(obj, attr)
    return getattr(obj, "fget", obj)  # a property: its getter


def test_the_plain_path_reads_in_a_sitting():
    lines = {name: len(inspect.getsource(plain_path_function(name)).splitlines()) for name in PLAIN_PATH}
    files = sorted({name.split(".")[0] for name in PLAIN_PATH})
    print(f"plain path: {len(PLAIN_PATH)} functions, {sum(lines.values())} lines in {len(files)} files")
    assert len(set(PLAIN_PATH)) == len(PLAIN_PATH) and len(files) <= 10, files
    assert "model_kernels" not in files  # model.py's formulas run by default (--kernels: the hand-written ones)
    assert sum(lines.values()) <= PLAIN_PATH_BUDGET, sorted(lines.items(), key=lambda kv: -kv[1])[:10]


def test_the_plain_path_is_what_a_step_runs(tmp_path, monkeypatch):
    import train_rl as T
    called, done = [], []

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or done:
            return
        if "torch/optim" in code.co_filename and code.co_name in ("step", "wrapper"):  # optimizer.step(): the end
            done.append(True)
        elif Path(code.co_filename).parent == ROOT and "<" not in code.co_qualname:
            name = f"{Path(code.co_filename).stem}.{code.co_qualname}"
            called.extend([name] if name not in called else [])

    def traced(*args):
        sys.setprofile(profile)
        try:
            return rl_step(*args)
        finally:
            sys.setprofile(None)
    rl_step = T.rl_step
    monkeypatch.setattr(T, "rl_step", traced)
    torch.set_num_threads(1)
    T.train(T.parse_args(["--model", "tiny", "--steps", "1", "--eval-every", "0", "--test-dataset", "",
                          "--save-every", "0", "--threads", "1", "--out", str(tmp_path / "run")]))
    assert called == PLAIN_PATH, f"a step now runs {called}: update PLAIN_PATH (and, measured, its budget)"
