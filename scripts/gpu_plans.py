#!/usr/bin/env python3
"""Every bundled study's GPU profile priced on one H100 by `ablate plan` (harness/study/cost.py), written in
two places that tests/test_cost.py holds to each other: the table of BENCHMARKS.md's section "GPU profiles:
expected wall time on one H100", and the line above each study file's `gpu:` profile.

    python scripts/gpu_plans.py                  # every bundled study with a gpu profile (minutes on 2 cores)
    python scripts/gpu_plans.py transformer-heads bible   # those rows and lines alone, the others kept

Studies whose data this machine lacks (bible's SWORD modules) are refused as `ablate plan` refuses them.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from datetime import date
from pathlib import Path

from ablate.sweep import PART_LIMIT_S

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "BENCHMARKS.md"
STUDIES = REPO / "ablations"
SECTION = "## GPU profiles: expected wall time on one H100"
LIMIT = f"--time-limit {PART_LIMIT_S:g}"  # each command's, as `ablate plan` counts them by default
HEADER = f"| study | variants | runs (fused seeds) | steps a run | expected | commands of `{LIMIT}` |"
# The line above a study file's `gpu:` profile: what `line` writes and tests/test_cost.py reads.
LINE = re.compile(rf"^  # On one H100 \(ablate plan\): about (\d+) min, (\d+) commands? of {LIMIT}\.$")


def line(minutes: int, commands: int) -> str:
    return f"  # On one H100 (ablate plan): about {minutes} min, {commands} command{'s' * (commands > 1)} of {LIMIT}."


def gpu_studies() -> list[str]:
    return sorted(p.stem for p in STUDIES.glob("*.yaml") if re.search(r"^  gpu:", p.read_text(), re.M))


def row(name: str) -> tuple[str, int, int]:
    """(the table's row, minutes, commands) of one study's GPU profile."""
    from ablate.harness.study.cost import estimate
    from ablate.harness.study.validate import load_study

    found = estimate(load_study(name, "gpu"))
    runs = sum(g.count for g in found.groups)
    fused = sorted({g.seeds for g in found.groups if g.seeds > 1})
    steps = sorted({g.steps for g in found.groups})
    minutes, commands = round(found.total_s / 60), found.parts(PART_LIMIT_S)
    cells = [name, str(found.variants), f"{runs}" + (f" ({', '.join(map(str, fused))})" if fused else ""),
             " / ".join(f"{s:,}" for s in steps), f"{minutes} min", str(commands)]  # fmt: skip
    return "| " + " | ".join(cells) + " |", minutes, commands


def write_line(name: str, minutes: int, commands: int) -> None:
    path = STUDIES / f"{name}.yaml"
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, text in enumerate(lines) if text.startswith("  gpu:"))
    if at and LINE.match(lines[at - 1].rstrip("\n")):
        del lines[at - 1]
        at -= 1
    lines.insert(at, line(minutes, commands) + "\n")
    path.write_text("".join(lines))


def write_table(rows: dict[str, str]) -> None:
    text = BENCHMARKS.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    old = {r.split(" | ")[0].removeprefix("| "): r for r in text[start:end].splitlines() if r.startswith("| ")
           and not r.startswith(("| study", "| ---"))}  # fmt: skip
    old.update(rows)
    # The commit whose code priced the rows: HEAD's, or the stamp already there when nothing was priced again.
    stamped = re.search(r"commit (\w+)\)", text[start:end])
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    commit = head.stdout.strip() if rows or not stamped else stamped[1]
    about = (
        f"`python scripts/gpu_plans.py` ({date.today().isoformat()}, commit {commit or 'unknown'}): "
        "each study's `ablate plan STUDY --profile gpu`, whose constants come from the four anchors above. What "
        "it assumes is printed under each plan; above all, every trial trains to `train.max_steps`. A study longer "
        f"than a command runs as that many commands of `ablate sweep STUDY --profile gpu {LIMIT}`, each "
        "continuing the last (README: A GPU profile in parts). The long rows are the LSTMs': their step stays "
        "eager (the encoder packs each batch by lengths read on the host), so Python launches each of their "
        "kernels, and their fused seeds run their stacks in turn; they are also the least sure, the eager "
        "kernel's time being fitted on a Transformer's step. The d_model 512 Transformers (transformer-heads, "
        "key-width, bible-lm) are bound by fp32 FLOPs, which bf16 would cut; no bf16 step at that width has "
        "been measured."
    )
    body = [SECTION, "", *textwrap.wrap(about, 110, break_on_hyphens=False), "", HEADER, "| --- | --- | --- | --- | --- | --- |",
            *(old[name] for name in sorted(old))]  # fmt: skip
    BENCHMARKS.write_text(text[:start] + "\n".join(body) + "\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="*", help="bundled studies (default: every one with a gpu profile)")
    parser.add_argument("--none", action="store_true", help="price none: the table's text and order again")
    args = parser.parse_args(argv)
    rows = {}
    for name in [] if args.none else args.studies or gpu_studies():
        rows[name], minutes, commands = row(name)
        print(rows[name], flush=True)
        write_line(name, minutes, commands)
    write_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
