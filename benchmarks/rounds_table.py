"""The per-round table of one or more rounds.py runs (docs/rounds.md), from their rounds.jsonl alone.

    python benchmarks/rounds_table.py runs/rounds/ladder-decompose-s0 runs/rounds/ladder-s0
"""

import json
import sys
from pathlib import Path


def rows_of(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "rounds.jsonl").read_text().splitlines() if x.strip()]


def table(run_dir):
    rows = rows_of(run_dir)
    groups = list(rows[0]["fast_by_group"])
    k = max(rows[0]["deliberate_pass_at_k"], key=lambda s: int(s.split("@")[1]))
    head = ["round", "fast (95% CI)", "deliberate (95% CI)", *[f"fast / delib. {g}" for g in groups], k,
            "fast len", "entropy", "selected per group", "round FLOPs", "cumulative FLOPs"]
    lines = [f"{run_dir}\n", "| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    ci = lambda r, m: f"{r[m + '_accuracy']:.3f} [{r[m + '_ci95'][0]:.2f}, {r[m + '_ci95'][1]:.2f}]"
    for r in rows:
        cells = [str(r["round"]), ci(r, "fast"), ci(r, "deliberate"),
                 *[f"{r['fast_by_group'][g]:.2f} / {r['deliberate_by_group'][g]:.2f}" for g in groups],
                 f"{r['deliberate_pass_at_k'][k]:.3f}", f"{r['fast_length_mean']:.0f}", f"{r['entropy']:.3f}",
                 " ".join(f"{g}:{n}" for g, n in r.get("selected_by_group", {}).items()) or "-",
                 f"{r['round_flops']:.2e}", f"{r['cumulative_flops']:.2e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(table(d) for d in sys.argv[1:]))
